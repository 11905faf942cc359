package xdsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/xds"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rawClient is a bare delta ADS stream to the server.
type rawClient struct {
	t      *testing.T
	stream grpc.BidiStreamingClient[deltaRequest, deltaResponse]
}

// dial opens a stream (TLS if cfg is non-nil) that ends with the test. It
// registers the leak check first so that it runs after everything stops.
func dial(t *testing.T, s *Server, cfg *tls.Config, md metadata.MD) *rawClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient("passthrough:///"+s.Addr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	t.Cleanup(func() {
		cancel()
		conn.Close()
	})
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, stream: st}
}

func (c *rawClient) send(r *deltaRequest) {
	c.t.Helper()
	if err := c.stream.Send(r); err != nil {
		c.t.Fatalf("Send: %v", err)
	}
}

func (c *rawClient) recv() *deltaResponse {
	c.t.Helper()
	r, err := c.stream.Recv()
	if err != nil {
		c.t.Fatalf("Recv: %v", err)
	}
	return r
}

// newTestServer starts a server that stops when t ends; the leak check
// runs after it has stopped.
func newTestServer(t *testing.T, cfg *tls.Config) *Server {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func tlsConfigs(t *testing.T, dnsNames ...string) (server, client *tls.Config) {
	t.Helper()
	server, client, err := TLSConfigs(dnsNames...)
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

// nextRequest is s.NextRequest(ctx, nil), failing t after 10 seconds.
func nextRequest(t *testing.T, s *Server) *deltaRequest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.NextRequest(ctx, nil)
	if err != nil {
		t.Fatalf("NextRequest: %v", err)
	}
	return r
}

func names(rs []*discoveryv3.Resource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.GetName())
	}
	return out
}

func workload(uid string) *workloadapi.Workload {
	return &workloadapi.Workload{Uid: uid, Name: uid, Namespace: "ns", Addresses: [][]byte{{10, 0, 0, 1}}}
}

// TestInitialResponse: the first request of a type gets every resource the
// client lacks or holds at another version, and removals for what the
// server no longer has.
func TestInitialResponse(t *testing.T) {
	s := newTestServer(t, nil)
	s.PushWorkload(workload("a"), workload("b"), workload("c"))
	held := s.Resources(xds.AddressTypeURL)
	c := dial(t, s, nil, nil)
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, InitialResourceVersions: map[string]string{
		"a": held["a"], "b": "stale", "gone": "v9", "c": "",
	}})
	resp := c.recv()
	if got, want := names(resp.GetResources()), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Errorf("initial resources = %v, want %v", got, want)
	}
	if got, want := resp.GetRemovedResources(), []string{"gone"}; !slices.Equal(got, want) {
		t.Errorf("initial removals = %v, want %v", got, want)
	}
	if resp.GetNonce() == "" || resp.GetTypeUrl() != xds.AddressTypeURL {
		t.Errorf("initial response nonce %q type %q", resp.GetNonce(), resp.GetTypeUrl())
	}

	// An empty set still gets an (empty) answer, so a client can become ready.
	c.send(&deltaRequest{TypeUrl: xds.AuthorizationTypeURL})
	if resp := c.recv(); resp.GetTypeUrl() != xds.AuthorizationTypeURL || len(resp.GetResources()) != 0 {
		t.Errorf("initial Authorization response = %v, want empty", resp)
	}
}

// TestPushRemoveAndRequests: pushes reach subscribed streams in order with
// fresh nonces; every request is logged.
func TestPushRemoveAndRequests(t *testing.T) {
	s := newTestServer(t, nil)
	c := dial(t, s, nil, metadata.Pairs("authorization", "Bearer t"))
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL})
	first := c.recv()
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, ResponseNonce: first.GetNonce()})

	n1 := s.PushWorkload(workload("a"))
	s.PushPolicy() // not subscribed: not sent
	n2 := s.Remove(xds.AddressTypeURL, "a", "unknown")
	r1, r2 := c.recv(), c.recv()
	if r1.GetNonce() != n1 || !slices.Equal(names(r1.GetResources()), []string{"a"}) || r1.GetResources()[0].GetVersion() == "" {
		t.Errorf("push response = %v, want resource a with a version and nonce %q", r1, n1)
	}
	if r2.GetNonce() != n2 || !slices.Equal(r2.GetRemovedResources(), []string{"a", "unknown"}) {
		t.Errorf("remove response = %v, want removals [a unknown] and nonce %q", r2, n2)
	}
	if n1 == n2 || n1 == first.GetNonce() {
		t.Errorf("nonces %q, %q, %q are not fresh", first.GetNonce(), n1, n2)
	}
	if got := s.Resources(xds.AddressTypeURL); len(got) != 0 {
		t.Errorf("resources after removal = %v", got)
	}

	req1 := nextRequest(t, s)
	req2 := nextRequest(t, s)
	if req1.GetResponseNonce() != "" || req2.GetResponseNonce() != first.GetNonce() {
		t.Errorf("logged requests = %v, %v; want the initial request, then its ACK", req1, req2)
	}
	if got := s.Metadata(); len(got) != 1 || !slices.Equal(got[0].Get("authorization"), []string{"Bearer t"}) {
		t.Errorf("Metadata() = %v", got)
	}
	if s.Connections() != 1 {
		t.Errorf("Connections() = %d, want 1", s.Connections())
	}
}

func TestSendKeepsNonce(t *testing.T) {
	s := newTestServer(t, nil)
	c := dial(t, s, nil, nil)
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL})
	c.recv()
	s.Send(&deltaResponse{TypeUrl: "type.googleapis.com/other", Nonce: "stale-1"})
	if r := c.recv(); r.GetNonce() != "stale-1" || r.GetTypeUrl() != "type.googleapis.com/other" {
		t.Errorf("Send delivered %v", r)
	}
	if len(s.Resources("type.googleapis.com/other")) != 0 {
		t.Error("Send changed the resource set")
	}
}

func TestCloseStreams(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"ok", nil, codes.OK},
		{"error", status.Error(codes.ResourceExhausted, "go away"), codes.ResourceExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestServer(t, nil)
			c := dial(t, s, nil, nil)
			c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL})
			c.recv()
			s.CloseStreams(tt.err)
			_, err := c.stream.Recv()
			if tt.err == nil {
				if !errors.Is(err, io.EOF) {
					t.Errorf("Recv after CloseStreams(nil) = %v, want io.EOF", err)
				}
				return
			}
			if status.Code(err) != tt.want {
				t.Errorf("Recv after CloseStreams = %v, want code %v", err, tt.want)
			}
		})
	}
}

// TestBlackhole: nothing gets through while on; switching off breaks the
// connections that lost bytes.
func TestBlackhole(t *testing.T) {
	srvTLS, cliTLS := tlsConfigs(t)
	s := newTestServer(t, srvTLS)
	c := dial(t, s, cliTLS, nil)
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL})
	c.recv()

	s.Blackhole(true)
	s.PushWorkload(workload("a"))
	got := make(chan error, 1)
	go func() {
		_, err := c.stream.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Recv returned (%v) through the blackhole", err)
	case <-time.After(300 * time.Millisecond):
	}
	s.Blackhole(false)
	select {
	case err := <-got:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("Recv after the blackhole = %v, want Unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connection not closed when the blackhole ended")
	}
}

func TestTLSConfigs(t *testing.T) {
	srvTLS, cliTLS := tlsConfigs(t, "extra.example")
	leaf := srvTLS.Certificates[0].Leaf
	if diff := cmp.Diff([]string{"localhost", "istiod.istio-system.svc", "extra.example"}, leaf.DNSNames); diff != "" {
		t.Errorf("DNS names (-want +got):\n%s", diff)
	}
	if cliTLS.RootCAs == nil || cliTLS.ServerName != "" {
		t.Errorf("client config = %+v", cliTLS)
	}
}

// TestCloseTwice: Close is idempotent, so a caller may both defer it and
// call it.
func TestCloseTwice(t *testing.T) {
	s, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
}
