// Package xdstest is the fake istiod for tests: xds/xdsserver's in-process
// delta ADS server, stopped when the test that started it ends, with
// failures reported through the test's testing.TB. Everything else (the
// resource set, pushes, faults, the request log) is xdsserver's; see its
// documentation. Code outside tests, such as bench, uses xdsserver itself,
// which imports no testing.
//
// Typical use:
//
//	srvTLS, cliTLS := xdstest.TLSConfigs(t)
//	s := xdstest.NewServer(t, srvTLS)
//	s.PushWorkload(&workloadapi.Workload{Uid: "c//Pod/ns/a", ...})
//	c, _ := xds.NewClient(xds.Config{Address: "https://" + s.Addr(), TLS: cliTLS, Store: st})
//
// Of this module, xdstest imports xds/xdsserver only.
package xdstest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/xds/xdsserver"
)

// Server is an xdsserver.Server that stops when the test that created it
// ends. NextRequest takes the test instead of a context; the other methods
// are xdsserver.Server's.
type Server struct {
	*xdsserver.Server
}

// NewServer starts a server on 127.0.0.1 with a random port, serving TLS
// with tlsCfg, or plaintext if tlsCfg is nil. It is stopped, and its
// goroutines ended, by tb.Cleanup.
func NewServer(tb testing.TB, tlsCfg *tls.Config) *Server {
	tb.Helper()
	s, err := xdsserver.New(tlsCfg)
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	tb.Cleanup(s.Close)
	return &Server{Server: s}
}

// nextRequestTimeout bounds NextRequest's wait.
const nextRequestTimeout = 10 * time.Second

// NextRequest returns the next request for which match returns true (any
// request if match is nil), discarding the others, and fails the test if
// none arrives within 10 seconds. Call it from the test goroutine.
func (s *Server) NextRequest(tb testing.TB, match func(*discoveryv3.DeltaDiscoveryRequest) bool) *discoveryv3.DeltaDiscoveryRequest {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nextRequestTimeout)
	defer cancel()
	r, err := s.Server.NextRequest(ctx, match)
	if err != nil {
		tb.Fatalf("xdstest: no matching request within %v", nextRequestTimeout)
	}
	return r
}

// TLSConfigs is xdsserver.TLSConfigs, failing the test on error: a server
// config with a fresh self-signed certificate and a client config that
// trusts only it.
func TLSConfigs(tb testing.TB, dnsNames ...string) (server, client *tls.Config) {
	tb.Helper()
	server, client, err := xdsserver.TLSConfigs(dnsNames...)
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	return server, client
}

// WorkloadResource is xdsserver.WorkloadResource: w as an Address resource
// named by its uid.
func WorkloadResource(w *workloadapi.Workload) *discoveryv3.Resource {
	return xdsserver.WorkloadResource(w)
}

// ServiceResource is xdsserver.ServiceResource: s as an Address resource
// named "namespace/hostname".
func ServiceResource(s *workloadapi.Service) *discoveryv3.Resource {
	return xdsserver.ServiceResource(s)
}

// PolicyResource is xdsserver.PolicyResource: p as an Authorization
// resource named "namespace/name".
func PolicyResource(p *security.Authorization) *discoveryv3.Resource {
	return xdsserver.PolicyResource(p)
}
