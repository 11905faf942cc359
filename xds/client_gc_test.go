package xds_test

import (
	"fmt"
	"math"
	"runtime/debug"
	"sync/atomic"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
	"github.com/gozt/gozt/xds/xdstest"
)

// gcPercent reads GOGC without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

// TestLargeResponseRelaxesGC checks, over a real stream, that a response
// large on the wire (2.5 MB) but of few resources (500 policies, too few for
// handleResponse to relax the collector by their count) is received and
// applied with the collector relaxed, and that the relaxation has ended by
// the time the client ACKs it; and that a client without
// Config.TunePushes leaves the process's collector alone.
func TestLargeResponseRelaxesGC(t *testing.T) {
	for _, tc := range []struct {
		tune bool
		want int // GOGC while the push is applied
	}{{true, 400}, {false, 100}} {
		t.Run(fmt.Sprintf("TunePushes=%v", tc.tune), func(t *testing.T) {
			if got := applyLargePush(t, tc.tune); got != tc.want {
				t.Errorf("GOGC %d while the large push was applied, want %d", got, tc.want)
			}
			if got := gcPercent(); got != 100 {
				t.Errorf("GOGC %d after the large push was ACKed, want 100 back", got)
			}
		})
	}
}

// applyLargePush sends a 2.5 MB push of 500 policies to a client (GOGC
// 100, no memory limit) and returns GOGC as the store applied it.
func applyLargePush(t *testing.T, tune bool) int {
	percent0, limit0 := gcPercent(), debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(percent0)
		debug.SetMemoryLimit(limit0)
	})
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)

	var applyPercent atomic.Int64
	st := state.NewStore(state.Config{OnUpdate: func(_, _ *state.Snapshot) { applyPercent.Store(int64(gcPercent())) }})
	h := newHarness(t, func(c *xds.Config) { c.Store, c.TunePushes = st, tune })
	h.start()
	h.waitReady()

	ports := make([]uint32, 2500)
	for i := range ports {
		ports[i] = uint32(i + 1)
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xds.AuthorizationTypeURL, Nonce: "n-large"}
	for i := range 500 {
		p := policyProto(fmt.Sprintf("p%d", i))
		p.Groups[0].Rules[0].Matches[0].DestinationPorts = ports
		resp.Resources = append(resp.Resources, xdstest.PolicyResource(p))
	}
	if size := proto.Size(resp); size < 2_000_000 {
		t.Fatalf("response is %d bytes on the wire, want at least 2 MB", size)
	}
	h.srv.Send(resp)
	if ack := h.answer("n-large"); ack.GetErrorDetail() != nil {
		t.Fatalf("answer to the large push = %v, want an ACK", ack)
	}
	if got := len(st.Snapshot().Policies()); got != 500 {
		t.Fatalf("store holds %d policies after the ACK, want 500", got)
	}
	return int(applyPercent.Load())
}
