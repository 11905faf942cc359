package xds_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
	"github.com/gozt/gozt/xds/xdstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// leakCheck makes the test fail if goroutines outlive it. Call it first:
// cleanups run last-registered first, so this one runs after the client and
// server have stopped.
func leakCheck(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// harness is a client wired to an xdstest server over loopback TLS.
type harness struct {
	t      *testing.T
	srv    *xdstest.Server
	store  *state.Store
	reg    *prometheus.Registry
	client *xds.Client
	dials  atomic.Int32 // TCP dials attempted
	down   atomic.Bool  // dials fail while set (the server looks down)
}

// newHarness builds the server and a client configured by mod (which may
// be nil). Call start to run the client.
func newHarness(t *testing.T, mod func(*xds.Config)) *harness {
	t.Helper()
	leakCheck(t)
	srvTLS, cliTLS := xdstest.TLSConfigs(t)
	h := &harness{
		t:     t,
		srv:   xdstest.NewServer(t, srvTLS),
		store: state.NewStore(state.Config{}),
		reg:   prometheus.NewRegistry(),
	}
	cfg := xds.Config{
		Address: "https://" + h.srv.Addr(),
		TLS:     cliTLS,
		Store:   h.store,
		Metrics: h.reg,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Dialer:  h.dial,
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := xds.NewClient(cfg)
	if err != nil {
		t.Fatalf("xds.NewClient: %v", err)
	}
	h.client = c
	return h
}

func (h *harness) dial(ctx context.Context, addr string) (net.Conn, error) {
	h.dials.Add(1)
	if h.down.Load() {
		return nil, errors.New("harness: server down")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// start runs the client until the test ends.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.client.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run = %v, want nil", err)
		}
	})
}

// waitReady fails the test if the client is not ready within 10s.
func (h *harness) waitReady() {
	h.t.Helper()
	select {
	case <-h.client.Ready():
	case <-time.After(10 * time.Second):
		h.t.Fatal("client not ready within 10s")
	}
}

// isReady reports whether Ready is closed.
func (h *harness) isReady() bool {
	select {
	case <-h.client.Ready():
		return true
	default:
		return false
	}
}

// answer returns the client's answer to the response with this nonce.
func (h *harness) answer(nonce string) *discoveryv3.DeltaDiscoveryRequest {
	h.t.Helper()
	return h.srv.NextRequest(h.t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		return r.GetResponseNonce() == nonce
	})
}

// nextReconnect returns the next initial request for typeURL that carries
// resource versions, that is, one sent after a reconnect.
func (h *harness) nextReconnect(typeURL string) *discoveryv3.DeltaDiscoveryRequest {
	h.t.Helper()
	return h.srv.NextRequest(h.t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		return r.GetResponseNonce() == "" && r.GetTypeUrl() == typeURL && len(r.GetInitialResourceVersions()) > 0
	})
}

// counter returns the value of the counter name with the given label value
// (0 if absent).
func (h *harness) counter(name, labelValue string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == labelValue {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 10*time.Second, what, cond)
}

// waitWithin polls cond until it holds, failing the test after d.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wl(uid string, last byte) *workloadapi.Workload {
	return &workloadapi.Workload{
		Uid: uid, Name: uid, Namespace: "ns",
		Addresses:      [][]byte{{10, 0, 0, last}},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}
}

func svcProto(host string, last byte) *workloadapi.Service {
	return &workloadapi.Service{
		Name: host, Namespace: "ns", Hostname: host,
		Addresses: []*workloadapi.NetworkAddress{{Address: []byte{10, 96, 0, last}}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}
}

func policyProto(name string) *security.Authorization {
	return &security.Authorization{
		Name: name, Namespace: "ns", Scope: security.Scope_NAMESPACE, Action: security.Action_ALLOW,
		Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{DestinationPorts: []uint32{80}}}}}}},
	}
}

// stateKeys lists the workload uids, service keys and policy keys in the
// store, sorted.
func stateKeys(s *state.Store) (workloads, services, policies []string) {
	snap := s.Snapshot()
	for _, w := range snap.Workloads() {
		workloads = append(workloads, w.UID)
	}
	for _, sv := range snap.Services() {
		services = append(services, sv.Key())
	}
	slices.Sort(services)
	for _, p := range snap.Policies() {
		policies = append(policies, p.Key())
	}
	return workloads, services, policies
}
