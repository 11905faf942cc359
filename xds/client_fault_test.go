package xds_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
)

// model is what the test pushed to the server: the state the client's
// store must end up equal to.
type model struct {
	workloads map[string]*workloadapi.Workload
	services  map[string]*workloadapi.Service
	policies  map[string]*security.Authorization
}

func newModel() *model {
	return &model{
		workloads: map[string]*workloadapi.Workload{},
		services:  map[string]*workloadapi.Service{},
		policies:  map[string]*security.Authorization{},
	}
}

// mutate makes a few random changes on the server and in m.
func (m *model) mutate(h *harness, r *rand.Rand) {
	for range 1 + r.IntN(4) {
		switch r.IntN(6) {
		case 0, 1:
			w := wl(fmt.Sprintf("w%d", r.IntN(30)), byte(r.IntN(250)))
			w.Node = fmt.Sprintf("node%d", r.IntN(1000)) // a changed field
			if r.IntN(3) == 0 {
				w.Services = map[string]*workloadapi.PortList{
					fmt.Sprintf("ns/s%d", r.IntN(5)): {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
				}
			}
			m.workloads[w.Uid] = w
			h.srv.PushWorkload(w)
		case 2:
			s := svcProto(fmt.Sprintf("s%d", r.IntN(5)), byte(r.IntN(250)))
			m.services[s.Namespace+"/"+s.Hostname] = s
			h.srv.PushService(s)
		case 3:
			p := policyProto(fmt.Sprintf("p%d", r.IntN(5)))
			p.Action = security.Action(r.IntN(2))
			m.policies[p.Namespace+"/"+p.Name] = p
			h.srv.PushPolicy(p)
		case 4:
			uid := fmt.Sprintf("w%d", r.IntN(30))
			delete(m.workloads, uid)
			h.srv.Remove(xds.AddressTypeURL, uid)
		case 5:
			key := fmt.Sprintf("ns/p%d", r.IntN(5))
			delete(m.policies, key)
			h.srv.Remove(xds.AuthorizationTypeURL, key)
		}
	}
}

var stateCmp = cmp.Options{
	cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}),
	cmpopts.IgnoreFields(state.Service{}, "Endpoints"),
	cmpopts.EquateEmpty(),
}

// diff returns how the store differs from m ("" if it does not).
func (m *model) diff(t *testing.T, st *state.Store) string {
	t.Helper()
	wantW := map[string]*state.Workload{}
	for uid, p := range m.workloads {
		w, err := xds.WorkloadFromProto(p)
		if err != nil {
			t.Fatalf("model workload %s: %v", uid, err)
		}
		wantW[uid] = w
	}
	wantS := map[string]*state.Service{}
	for key, p := range m.services {
		s, err := xds.ServiceFromProto(p)
		if err != nil {
			t.Fatalf("model service %s: %v", key, err)
		}
		wantS[key] = s
	}
	wantP := map[string]*rbac.Policy{}
	for key, p := range m.policies {
		pol, err := xds.PolicyFromProto(p)
		if err != nil {
			t.Fatalf("model policy %s: %v", key, err)
		}
		wantP[key] = pol
	}
	snap := st.Snapshot()
	gotW := map[string]*state.Workload{}
	for _, w := range snap.Workloads() {
		gotW[w.UID] = w
	}
	gotS := map[string]*state.Service{}
	for _, s := range snap.Services() {
		gotS[s.Key()] = s
	}
	gotP := map[string]*rbac.Policy{}
	for _, p := range snap.Policies() {
		gotP[p.Key()] = p
	}
	return cmp.Diff(wantW, gotW, stateCmp) + cmp.Diff(wantS, gotS, stateCmp) + cmp.Diff(wantP, gotP, stateCmp)
}

func (m *model) waitConverged(t *testing.T, h *harness, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := m.diff(t, h.store)
		if d == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: store differs from the server (-server +store):\n%s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFlapping: TESTPLAN F3. The server goes down and up repeatedly, ending
// streams with OK or an error, while resources change both when the client
// is connected and when it is not. After each recovery the store equals the
// server's state, and goroutines do not accumulate.
func TestFlapping(t *testing.T) {
	h := newHarness(t, func(c *xds.Config) { c.Backoff = xds.Backoff{Max: 100 * time.Millisecond} })
	m := newModel()
	r := rand.New(rand.NewPCG(7, 7))
	for range 5 {
		m.mutate(h, r)
	}
	h.start()
	h.waitReady()
	m.waitConverged(t, h, "initial sync")
	base := runtime.NumGoroutine()

	for cycle := range 12 {
		h.down.Store(true)
		if cycle%2 == 0 {
			h.srv.CloseStreams(nil)
		} else {
			h.srv.CloseStreams(status.Error(codes.Unavailable, "flapping"))
		}
		m.mutate(h, r)
		time.Sleep(time.Duration(r.IntN(60)) * time.Millisecond)
		h.down.Store(false)
		m.mutate(h, r)
		m.waitConverged(t, h, fmt.Sprintf("cycle %d", cycle))
	}
	if n := h.srv.Connections(); n < 13 {
		t.Errorf("streams opened = %d, want at least 13", n)
	}
	waitFor(t, "goroutines back to baseline", func() bool { return runtime.NumGoroutine() <= base+2 })
}

// TestBlackhole: TESTPLAN F4. A server that keeps the TCP connection open
// but sends nothing is detected by the HTTP/2 keepalive (gRPC's minimum
// PING interval is 10s), and the client reconnects once it answers again.
func TestBlackhole(t *testing.T) {
	h := newHarness(t, func(c *xds.Config) {
		c.KeepaliveTime = 10 * time.Second
		c.KeepaliveTimeout = time.Second
		c.ConnectTimeout = time.Second
		c.Backoff = xds.Backoff{Max: 200 * time.Millisecond}
	})
	h.srv.PushWorkload(wl("a", 1))
	h.start()
	h.waitReady()

	dials := h.dials.Load()
	start := time.Now()
	h.srv.Blackhole(true)
	h.srv.PushWorkload(wl("b", 2)) // lost in the blackhole
	waitWithin(t, 20*time.Second, "a new dial after the blackhole", func() bool { return h.dials.Load() > dials })
	detected := time.Since(start)
	t.Logf("blackhole detected after %v", detected)
	if detected < 9*time.Second {
		t.Errorf("reconnected after %v, before any keepalive could fail: the stream did not stay open", detected)
	}
	if got := h.counter("istio_xds_connection_terminations_total", "Error"); got < 1 {
		t.Errorf(`terminations{reason="Error"} = %v, want ≥ 1`, got)
	}
	if h.store.Snapshot().WorkloadByUID("b") != nil {
		t.Error("workload b arrived through the blackhole")
	}

	h.srv.Blackhole(false)
	waitFor(t, "workload b after the server recovers", func() bool {
		return h.store.Snapshot().WorkloadByUID("b") != nil
	})
}
