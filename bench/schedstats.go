package bench

import (
	"math"
	"runtime/metrics"
	"sync"
)

// schedHists are the runtime's histograms that say why a goroutine that
// was ready did not run: how long the world took to stop for a collection
// and how long it stayed stopped, and how long goroutines waited runnable
// before they ran. The "sched" command reports, for each, the longest
// interval seen since the previous "sched" (the upper bound of the highest
// bucket that gained counts), so that a scenario can say which one a stall
// of a live connection was.
var schedHists = []struct{ key, name string }{
	{"stw_stopping", "/sched/pauses/stopping/gc:seconds"},
	{"stw_total", "/sched/pauses/total/gc:seconds"},
	{"other_stw_total", "/sched/pauses/total/other:seconds"},
	{"runnable", "/sched/latencies:seconds"},
}

var (
	schedMu   sync.Mutex
	schedLast = map[string][]uint64{} // counts at the previous "sched"
)

// schedStats returns, for each of schedHists, "KEY_max_ms" since the
// previous call (since the start, for the first).
func schedStats() map[string]float64 {
	samples := make([]metrics.Sample, len(schedHists))
	for i, h := range schedHists {
		samples[i].Name = h.name
	}
	metrics.Read(samples)
	schedMu.Lock()
	defer schedMu.Unlock()
	out := map[string]float64{}
	for i, h := range schedHists {
		if samples[i].Value.Kind() != metrics.KindFloat64Histogram {
			continue
		}
		hist := samples[i].Value.Float64Histogram()
		maxS := histDelta(hist.Buckets, hist.Counts, schedLast[h.key])
		schedLast[h.key] = append(schedLast[h.key][:0], hist.Counts...)
		out[h.key+"_max_ms"] = maxS * 1e3
	}
	return out
}

// histDelta compares a histogram's counts with prev (nil: all zero): it
// returns the upper bound of the highest bucket whose count grew (its lower
// bound if the upper is +Inf; 0 if none grew). buckets has one more element
// than counts, as in metrics.Float64Histogram.
func histDelta(buckets []float64, counts, prev []uint64) (maxBound float64) {
	for i, c := range counts {
		var p uint64
		if i < len(prev) {
			p = prev[i]
		}
		if c <= p {
			continue
		}
		hi := buckets[i+1]
		if math.IsInf(hi, 1) {
			hi = buckets[i]
		}
		maxBound = hi
	}
	return maxBound
}
