package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/state"
)

// serveProxy starts a proxy for cfg, listening and serving until the test
// ends; it is then shut down, its open connections given drain to end.
func serveProxy(t *testing.T, cfg Config, drain time.Duration) *Proxy {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), drain)
		defer cancel()
		p.Shutdown(ctx)
		<-served
	})
	return p
}

// dialHBONE opens an HBONE client connection to dst (ip:port) from the
// local address src ("" for any) with cert, expecting the server to be
// san, within ctx; it is closed when the test ends, before the proxies
// started earlier shut down.
func dialHBONE(t *testing.T, ctx context.Context, src, dst string, cert *certs.Cert, san string) *hbone.ClientConn {
	t.Helper()
	var d net.Dialer
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	raw, err := d.Dial("tcp", dst)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{san})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// nsWorkload is workload ns/name of the proxy tests: service account name,
// trust domain cluster.local, HBONE, at ip.
func nsWorkload(name, ip string) *state.Workload {
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", ServiceAccount: name,
		TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Protocol: state.TunnelHBONE}
}

// storeWith returns a store that fill filled, failing the test on any of
// the errors fill returns.
func storeWith(t *testing.T, fill func(b *state.Batch) []error) *state.Store {
	t.Helper()
	store := state.NewStore(state.Config{})
	var errs []error
	store.Update(func(b *state.Batch) { errs = fill(b) })
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return store
}
