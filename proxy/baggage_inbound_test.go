package proxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// inboundOnce starts an inbound-only proxy for a server workload on
// 127.88.251.3, configured by cfg, and sends it one CONNECT from a client
// workload on 127.88.251.2 to an application that accepts; it returns the
// 200's header. Everything it started has stopped when it returns: it runs
// as a subtest, whose cleanups end the proxy and the connection.
func inboundOnce(t *testing.T, cfg func(*Config)) http.Header {
	t.Helper()
	return inboundOnceWith(t, inboundOpts{cfg: cfg})
}

// inboundOpts vary inboundOnce: the proxy's config, the CONNECT's header,
// and whether xDS knows the client workload.
type inboundOpts struct {
	cfg           func(*Config)
	header        http.Header
	unknownClient bool
}

func inboundOnceWith(t *testing.T, o inboundOpts) http.Header {
	t.Helper()
	var h http.Header
	if !t.Run("connect", func(t *testing.T) { h = inboundOnceIn(t, o) }) {
		t.FailNow()
	}
	return h
}

func inboundOnceIn(t *testing.T, o inboundOpts) http.Header {
	t.Helper()
	const clientIP, serverIP = "127.88.251.2", "127.88.251.3"
	app, err := net.Listen("tcp", serverIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	go func() {
		for {
			c, err := app.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	appPort := app.Addr().(*net.TCPAddr).Port

	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := state.NewStore(state.Config{})
	var errs []error
	store.Update(func(b *state.Batch) {
		if !o.unknownClient {
			errs = append(errs, b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/client", Name: "client", Namespace: "ns", ServiceAccount: "client",
				WorkloadName: "client", CanonicalName: "client-app", CanonicalRevision: "v1", ClusterID: "c1",
				TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(clientIP)}, Protocol: state.TunnelHBONE}))
		}
		errs = append(errs,
			b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/server", Name: "server", Namespace: "ns", ServiceAccount: "server",
				WorkloadName: "server", CanonicalName: "server-app", ClusterID: "c1",
				TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(serverIP)}, Protocol: state.TunnelHBONE}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	c := Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(serverIP), InboundOnly: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
	}
	o.cfg(&c)
	serveProxy(t, c, 5*time.Second)
	cert, err := ca.Issue(context.Background(), ppClientID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc := dialHBONE(t, ctx, clientIP, net.JoinHostPort(serverIP, "15008"), cert, ppServerID.String())
	s, err := cc.Connect(ctx, net.JoinHostPort(serverIP, strconv.Itoa(appPort)), o.header)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	defer s.Close()
	return s.ResponseHeader()
}

// TestResponseBaggage: the 200 to an inbound CONNECT carries the local
// workload's baggage by default and none with NoResponseBaggage
// (ENABLE_RESPONSE_BAGGAGE=false), as ztunnel's build_response (SPEC §2.3).
func TestResponseBaggage(t *testing.T) {
	want := baggage(&state.Workload{Name: "server", Namespace: "ns", WorkloadName: "server", CanonicalName: "server-app", ClusterID: "c1"})
	if want == "" {
		t.Fatal("the server workload has no baggage")
	}
	if got := inboundOnce(t, func(*Config) {}).Get(headerBaggage); got != want {
		t.Errorf("default: baggage on the 200 = %q, want %q", got, want)
	}
	h := inboundOnce(t, func(c *Config) { c.NoResponseBaggage = true })
	if got, ok := h[http.CanonicalHeaderKey(headerBaggage)]; ok {
		t.Errorf("NoResponseBaggage: baggage on the 200 = %q, want none", got)
	}
}

// TestAuthzInfoLogging: each authorization decision is logged at debug, or
// at info with AuthzInfoLogging (AUTHZ_POLICY_INFO_LOGGING), with ztunnel's
// message; an info-level logger sees it only in the second case.
func TestAuthzInfoLogging(t *testing.T) {
	for _, tc := range []struct {
		info      bool
		wantLevel string // "" for no line
	}{
		{false, ""},
		{true, "INFO"},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		inboundOnce(t, func(c *Config) { c.Logger, c.AuthzInfoLogging = log, tc.info })
		var got []string
		for line := range strings.Lines(buf.String()) {
			if strings.Contains(line, `msg="no allow policies, allow"`) {
				got = append(got, line)
			}
		}
		switch {
		case tc.wantLevel == "" && len(got) != 0:
			t.Errorf("AuthzInfoLogging=false: info log has %q, want no decision line", got)
		case tc.wantLevel != "" && (len(got) != 1 || !strings.Contains(got[0], "level="+tc.wantLevel) ||
			!strings.Contains(got[0], "src.identity="+ppClientID.String())):
			t.Errorf("AuthzInfoLogging=true: decision lines %q, want one at %s naming the peer", got, tc.wantLevel)
		}
	}
}
