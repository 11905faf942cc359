package admin

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
)

// switchIssuer issues from ca, which a test may switch.
type switchIssuer struct {
	mu sync.Mutex
	ca *localca.CA
}

func (s *switchIssuer) Issue(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	s.mu.Lock()
	ca := s.ca
	s.mu.Unlock()
	return ca.Issue(ctx, id)
}

// TestConfigDumpRootsDuringRotation: while the CA rotates from root A to
// root B, each certificate's rootCerts (istioctl ztunnel-config
// certificates' Root rows) lists what gozt trusts, both roots, including
// for the identity whose own leaf still comes from A.
func TestConfigDumpRootsDuringRotation(t *testing.T) {
	caA, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	caB, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	iss := &switchIssuer{ca: caA}
	m := certs.NewManager(certs.ManagerConfig{Issuer: iss})
	a := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "a"}
	b := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "b"}
	if _, err := m.Get(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	iss.mu.Lock()
	iss.ca = caB
	iss.mu.Unlock()
	if _, err := m.Get(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	want := []string{caA.Roots()[0].SerialNumber.String(), caB.Roots()[0].SerialNumber.String()}
	slices.Sort(want)
	for _, cj := range certificates(m.States()) {
		var got []string
		for _, r := range cj.RootCerts {
			got = append(got, r.SerialNumber)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: rootCerts serials = %v, want roots A and B %v", cj.Identity, got, want)
		}
	}
}
