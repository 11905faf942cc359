package xds

import (
	"crypto/tls"
	"fmt"
	"math"
	"runtime/debug"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// gcSettings reads the GC percent and memory limit without changing them.
func gcSettings() (percent int, limit int64) {
	percent = debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1)
}

func TestRelaxGC(t *testing.T) {
	percent0, limit0 := gcSettings()
	t.Cleanup(func() {
		debug.SetGCPercent(percent0)
		debug.SetMemoryLimit(limit0)
	})

	t.Run("small push", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		r := relaxGC(relaxGCMin - 1)
		if p, l := gcSettings(); p != 100 || l != math.MaxInt64 {
			t.Errorf("during a small push: GOGC %d, limit %d; want unchanged", p, l)
		}
		r.end()
	})

	t.Run("large push", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		const n = 100_000
		r := relaxGC(n)
		p, l := gcSettings()
		if p != relaxedGCPercent {
			t.Errorf("during a large push: GOGC %d, want %d", p, relaxedGCPercent)
		}
		if floor := int64(relaxedHeapSlack + n*relaxedPerResource); l < floor || l == math.MaxInt64 {
			t.Errorf("during a large push: memory limit %d, want a cap of at least %d", l, floor)
		}
		r.end()
		if p, l := gcSettings(); p != 100 || l != math.MaxInt64 {
			t.Errorf("after the push: GOGC %d, limit %d; want 100 and no limit back", p, l)
		}
	})

	t.Run("operator limit kept when lower", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(64 << 20)
		r := relaxGC(relaxGCMin)
		if _, l := gcSettings(); l != 64<<20 {
			t.Errorf("memory limit %d during a push, want the operator's %d", l, 64<<20)
		}
		r.end()
		if _, l := gcSettings(); l != 64<<20 {
			t.Errorf("memory limit %d after a push, want %d", l, 64<<20)
		}
	})

	for _, gogc := range []int{-1, relaxedGCPercent, 1000} {
		debug.SetGCPercent(gogc)
		debug.SetMemoryLimit(math.MaxInt64)
		r := relaxGC(relaxGCMin * 10)
		if p, l := gcSettings(); p != gogc || l != math.MaxInt64 {
			t.Errorf("GOGC=%d: during a push GOGC %d, limit %d; want unchanged", gogc, p, l)
		}
		r.end()
	}
}

func TestMemoryCap(t *testing.T) {
	if got, want := memoryCap(100<<20, 1000), int64(200<<20+relaxedHeapSlack+1000*relaxedPerResource); got != want {
		t.Errorf("memoryCap = %d, want %d", got, want)
	}
	if got := memoryCap(math.MaxUint64, math.MaxInt); got != math.MaxInt64 {
		t.Errorf("memoryCap overflow = %d, want MaxInt64", got)
	}
}

// withGCPercent100 runs the test with GOGC=100 and no memory limit, so that
// a large push relaxes the collector, and restores the settings after it.
func withGCPercent100(t *testing.T) {
	t.Helper()
	percent0, limit0 := gcSettings()
	t.Cleanup(func() {
		debug.SetGCPercent(percent0)
		debug.SetMemoryLimit(limit0)
	})
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)
}

// wantGCPercent fails the test unless GOGC is want now.
func wantGCPercent(t *testing.T, when string, want int) {
	t.Helper()
	if p, _ := gcSettings(); p != want {
		t.Errorf("%s: GOGC %d, want %d", when, p, want)
	}
}

// wantSettingsFree fails the test if a relaxation still holds gcSettingsMu.
func wantSettingsFree(t *testing.T, when string) {
	t.Helper()
	if !gcSettingsMu.TryLock() {
		t.Errorf("%s: a GC relaxation is still in force", when)
		return
	}
	gcSettingsMu.Unlock()
}

// TestHandleResponseEndsRelaxation checks that handleResponse applies a push
// under the relaxation it is handed, starts none of its own, raises its
// memory cap to the push's size, and ends it exactly once, whatever it
// answers.
func TestHandleResponseEndsRelaxation(t *testing.T) {
	withGCPercent100(t)
	// good has enough removals that handleResponse would relax by itself,
	// so that starting a second relaxation would wait for the first
	// forever.
	good := func() *discoveryv3.DeltaDiscoveryResponse {
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "good",
			Resources: []*discoveryv3.Resource{workloadResource(t, "Kubernetes//Pod/ns/a", 1)}}
		for i := range 2 * relaxGCMin {
			resp.RemovedResources = append(resp.RemovedResources, fmt.Sprintf("gone-%d", i))
		}
		return resp
	}
	bad := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "bad",
		Resources: []*discoveryv3.Resource{workloadResource(t, "Kubernetes//Pod/ns/b", 2), {Name: "empty"}}}
	unsubscribed := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/other", Nonce: "other"}
	tests := []struct {
		name    string
		resp    *discoveryv3.DeltaDiscoveryResponse
		ack     bool
		applied bool
	}{
		{"ACK", good(), true, true},
		{"NACK", bad, false, true},
		{"unsubscribed type", unsubscribed, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var applyPercent int
			st := state.NewStore(state.Config{OnUpdate: func(_, _ *state.Snapshot) { applyPercent, _ = gcSettings() }})
			c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
			if err != nil {
				t.Fatal(err)
			}
			r := relaxGCForWire(relaxGCMinBytes)
			if r == nil {
				t.Fatal("relaxGCForWire(relaxGCMinBytes) relaxed nothing")
			}
			t.Cleanup(func() { endLeaked([]*gcRelaxation{r}) })
			if _, ack := c.handleResponse(tt.resp, r); ack != tt.ack {
				t.Errorf("handleResponse ack = %v, want %v", ack, tt.ack)
			}
			if tt.applied && applyPercent != relaxedGCPercent {
				t.Errorf("GOGC %d while applying, want %d", applyPercent, relaxedGCPercent)
			}
			if n := len(tt.resp.GetRemovedResources()); n > relaxGCMin && r.n != n+len(tt.resp.GetResources()) {
				t.Errorf("memory cap allows for %d resources, want the push's %d", r.n, n+len(tt.resp.GetResources()))
			}
			if r.ended != 1 {
				t.Errorf("relaxation ended %d times, want 1", r.ended)
			}
			wantGCPercent(t, "after handleResponse", 100)
			wantSettingsFree(t, "after handleResponse")
		})
	}

	t.Run("none handed", func(t *testing.T) {
		var applyPercent int
		st := state.NewStore(state.Config{OnUpdate: func(_, _ *state.Snapshot) { applyPercent, _ = gcSettings() }})
		c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, ack := c.handleResponse(good(), nil); !ack {
			t.Error("handleResponse NACKed a good push")
		}
		if applyPercent != relaxedGCPercent {
			t.Errorf("large push without a relaxation: GOGC %d while applying, want %d", applyPercent, relaxedGCPercent)
		}
		wantGCPercent(t, "after handleResponse", 100)
		wantSettingsFree(t, "after handleResponse")
	})
}

// workloadResource returns an Address resource of a workload uid with IP
// 10.0.0.last.
func workloadResource(t *testing.T, uid string, last byte) *discoveryv3.Resource {
	t.Helper()
	payload, err := anypb.New(WorkloadAddress(&workloadapi.Workload{
		Uid: uid, Name: uid, Namespace: "ns", Addresses: [][]byte{{10, 0, 0, last}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.Resource{Name: uid, Version: "1", Resource: payload}
}
