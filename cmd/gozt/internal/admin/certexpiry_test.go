package admin

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
)

// TestCertExpiry: istio_cert_expiry_seconds has one series per certificate
// a real manager holds, equal to its leaf's NotAfter in Unix seconds; the
// manager's rotation (at half-life of a 2 s leaf) moves it; an identity
// the manager forgets leaves the scrape (issue 39 item 1).
func TestCertExpiry(t *testing.T) {
	ca, err := localca.New(localca.Config{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := certs.NewManager(certs.ManagerConfig{Issuer: ca})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCertExpiry(m.States))

	a := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "a"}
	b := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "b"}
	expiry := func(id identity.Identity) float64 {
		c, err := m.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return float64(c.Chain()[0].NotAfter.Unix())
	}
	want := func(values map[identity.Identity]float64) string {
		var out strings.Builder
		out.WriteString("# HELP istio_cert_expiry_seconds " + certExpiryHelp + "\n# TYPE istio_cert_expiry_seconds gauge\n")
		for _, id := range []identity.Identity{a, b} {
			if v, ok := values[id]; ok {
				out.WriteString(`istio_cert_expiry_seconds{identity="` + id.String() + `"} ` + strconv.FormatFloat(v, 'f', -1, 64) + "\n")
			}
		}
		return out.String()
	}

	// A rotation may land between reading the certificates and the
	// scrape: a mismatch is retried with fresh values, a wrong value
	// fails every try.
	scrape := func(ids ...identity.Identity) (map[identity.Identity]float64, error) {
		var err error
		for range 5 {
			values := map[identity.Identity]float64{}
			for _, id := range ids {
				values[id] = expiry(id)
			}
			if err = testutil.GatherAndCompare(reg, strings.NewReader(want(values)), "istio_cert_expiry_seconds"); err == nil {
				return values, nil
			}
		}
		return nil, err
	}
	first, err := scrape(a, b)
	if err != nil {
		t.Fatal(err)
	}

	// Rotation: the manager renews at half-life; the series follows.
	deadline := time.Now().Add(10 * time.Second)
	for expiry(a) == first[a] {
		if time.Now().After(deadline) {
			t.Fatal("the manager did not rotate a's 2 s certificate within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.Forget(b)
	after, err := scrape(a)
	if err != nil {
		t.Fatalf("after a's rotation and b forgotten: %v", err)
	}
	if after[a] <= first[a] {
		t.Errorf("a's expiry went from %v to %v, want later", first[a], after[a])
	}
}
