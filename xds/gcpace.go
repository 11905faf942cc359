package xds

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// A large push allocates over a kilobyte per resource while it is decoded,
// converted and applied (about 3.5 KB before the fast workload decoder of
// decode_fast.go, 1.3 KB since: 134 MB for 100,000 workloads in
// BenchmarkApplyPush100k), and with Go's default
// GOGC every few tens of megabytes start a garbage collection that marks the
// whole store again. On a small node the collector's mark worker then holds
// a processor that a relay goroutine is waiting for: in gozt bench's xds-push
// scenario the longest stall of a live connection was 20.6–28.4 ms at
// GOGC=100 and 8.6–16 ms with GOGC=400 set for every process (interleaved
// runs, 2 cores). Relaxing the collector only while the push is applied, as
// below, took the median from 20.8 to 16.9 ms over 12 interleaved pairs.
// With the fast decoder, the relaxed collector no longer runs at all while
// a 100,000-workload push is applied (gc/op in BenchmarkNetDuringPush100k:
// 1 before, 0 after).
//
// So while a push of at least relaxGCMin resources is applied, the collector
// runs as if GOGC were relaxedGCPercent, within a memory cap: the live heap
// at the start times relaxedHeapFactor, plus relaxedHeapSlack, plus
// relaxedPerResource for each resource of the push (what decoding one
// allocates, with room: the cap must never sit below what the push needs
// live, or the collector would run back to back), or the operator's
// GOMEMLIMIT if lower. Both settings are restored when the push
// is applied. A process whose GOGC is already higher (or off) is left as it
// is, and small pushes (a policy change) never touch the settings.
const (
	relaxGCMin         = 10_000
	relaxedGCPercent   = 400
	relaxedHeapFactor  = 2
	relaxedHeapSlack   = 128 << 20
	relaxedPerResource = 4 << 10
)

// gcSettingsMu serialises changes to the process's GC settings, so that two
// clients applying large pushes at once restore them in order.
var gcSettingsMu sync.Mutex

// relaxGC applies the relaxed collector settings for a push of n resources
// and returns the function that restores the previous ones.
func relaxGC(n int) (restore func()) {
	if n < relaxGCMin {
		return func() {}
	}
	gcSettingsMu.Lock()
	percent := debug.SetGCPercent(relaxedGCPercent)
	if percent < 0 || percent >= relaxedGCPercent {
		debug.SetGCPercent(percent)
		gcSettingsMu.Unlock()
		return func() {}
	}
	limit := debug.SetMemoryLimit(-1)
	debug.SetMemoryLimit(min(limit, memoryCap(liveHeap(), n)))
	return func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(percent)
		gcSettingsMu.Unlock()
	}
}

// memoryCap is the memory limit while a push of n resources is applied,
// for a live heap of heap bytes.
func memoryCap(heap uint64, n int) int64 {
	c := float64(heap)*relaxedHeapFactor + relaxedHeapSlack + float64(n)*relaxedPerResource
	if c >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(c)
}

// liveHeap reads the heap's object bytes without stopping the world (as
// runtime.ReadMemStats would).
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
