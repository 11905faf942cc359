package bench

import (
	"math"
	"runtime"
	"testing"
)

func TestHistDelta(t *testing.T) {
	inf := math.Inf(1)
	buckets := []float64{0, 1e-4, 1e-3, 1e-2, inf}
	for _, tc := range []struct {
		name    string
		counts  []uint64
		prev    []uint64
		wantMax float64
	}{
		{"nothing new", []uint64{5, 2, 1, 0}, []uint64{5, 2, 1, 0}, 0},
		{"first read", []uint64{5, 2, 0, 0}, nil, 1e-3},
		{"only old counts high", []uint64{6, 2, 3, 0}, []uint64{5, 2, 3, 0}, 1e-4},
		{"new count in a high bucket", []uint64{5, 2, 4, 0}, []uint64{5, 2, 1, 0}, 1e-2},
		{"open last bucket reports its lower bound", []uint64{5, 2, 1, 2}, []uint64{5, 2, 1, 0}, 1e-2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := histDelta(buckets, tc.counts, tc.prev); got != tc.wantMax {
				t.Errorf("histDelta = %g; want %g", got, tc.wantMax)
			}
		})
	}
}

// TestSchedStatsSinceLastCall: a collection between two calls shows in the
// second as a stop-the-world, and a call with nothing between reports none.
func TestSchedStatsSinceLastCall(t *testing.T) {
	schedStats()
	runtime.GC()
	got := schedStats()
	if got["stw_total_max_ms"] <= 0 {
		t.Errorf("after runtime.GC: stw_total_max_ms = %g, want > 0 (%v)", got["stw_total_max_ms"], got)
	}
	if got := schedStats(); got["stw_total_max_ms"] != 0 || got["stw_stopping_max_ms"] != 0 {
		t.Errorf("with no collection since the last call: %v, want no stop-the-world", got)
	}
}
