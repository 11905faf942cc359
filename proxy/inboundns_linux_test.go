package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
	"github.com/prometheus/client_golang/prometheus"
)

// startInboundInNetns runs an inbound-only proxy for one HBONE workload,
// ns/server at ip, whose sockets inNetns makes in a network namespace, and
// returns an HBONE client connection to its 15008 with a client identity of
// the same CA, made within ctx, and the proxy. Both end with the test.
func startInboundInNetns(t *testing.T, ctx context.Context, ip string, inNetns netns.Func) (*hbone.ClientConn, *Proxy) {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "server"}
	store := state.NewStore(state.Config{})
	store.Update(func(b *state.Batch) {
		err = b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/server", Name: "server", Namespace: "ns", ServiceAccount: "server",
			TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Protocol: state.TunnelHBONE})
	})
	if err != nil {
		t.Fatal(err)
	}
	p := serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(ip), InboundOnly: true, InNetns: inNetns,
		Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
	}, 100*time.Millisecond)
	cert, err := ca.Issue(context.Background(), identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	var raw net.Conn
	if err := inNetns.Run(func() (err error) { raw, err = net.Dial("tcp", ip+":15008"); return err }); err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{id.String()})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() }) // before the proxy's Shutdown: cleanups run last first
	return cc, p
}
