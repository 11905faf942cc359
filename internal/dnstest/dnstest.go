// Package dnstest runs the test DNS servers of gozt's tests (a fake
// upstream, a pod's nameserver) for as long as a test runs. Only tests
// import it.
package dnstest

import (
	"testing"

	"github.com/miekg/dns"
)

// Serve runs srv, on the PacketConn or Listener it was given, until the
// test ends. It returns once srv is serving, or fails t if srv stops
// before it starts.
func Serve(t testing.TB, srv *dns.Server) {
	t.Helper()
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	served := make(chan error, 1)
	go func() { served <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-served:
		t.Fatalf("DNS server stopped before it started: %v", err)
	}
	t.Cleanup(func() { srv.Shutdown(); <-served })
}
