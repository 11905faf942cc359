package xds

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// With Config.TunePushes (the process's owner opts in: these are
// process-wide settings), the collector is relaxed while a large push is
// received and applied. A
// push allocates over a kilobyte per resource while it is decoded,
// converted and applied, and at Go's default GOGC every few tens of
// megabytes start a collection that marks the whole store again; on a small
// node its mark worker holds a processor that a relay goroutine is waiting
// for, and live connections stall.
//
// So while a push of at least relaxGCMin resources is applied, the collector
// runs as if GOGC were relaxedGCPercent, within a memory cap: the live heap
// at the start times relaxedHeapFactor, plus relaxedHeapSlack, plus
// relaxedPerResource for each resource of the push (what decoding one
// allocates, with room: the cap must never sit below what the push needs
// live, or the collector would run back to back), or the operator's
// GOMEMLIMIT if lower. Both settings are restored when the push is applied.
// A process whose GOGC is already higher (or off) is left as it is. A
// response is relaxed by its resource count (relaxGCMin) or its wire size
// (relaxGCMinBytes, below), so a small push of large resources is relaxed
// too; a policy change of a few resources never is.
//
// The stream's codec (codec.go) relaxes the collector already before gRPC
// unmarshals a response of at least relaxGCMinBytes, which is relaxGCMin
// resources of typicalResourceBytes, and handleResponse applies the push
// under that same relaxation. Until the resources are counted, the cap
// allows for one resource per typicalResourceBytes of the wire size;
// handleResponse raises it if the push has more.
//
// Measurements, and what was tried and not kept (the collector off for the
// push): bench/NOTES.md, "Why the collector is relaxed during a push".
const (
	relaxGCMin         = 10_000
	relaxedGCPercent   = 400
	relaxedHeapFactor  = 2
	relaxedHeapSlack   = 128 << 20
	relaxedPerResource = 4 << 10

	// typicalResourceBytes is the wire size of a small Address resource:
	// a service with two ports is about 150 bytes, a pod workload 220–250
	// (BenchmarkApplyPush100k's). Sizing by the smaller one means a push
	// of relaxGCMin resources of either kind is relaxed from the start.
	typicalResourceBytes = 150
	relaxGCMinBytes      = relaxGCMin * typicalResourceBytes // 1.5 MB
)

// gcSettingsMu serialises changes to the process's GC settings, so that two
// clients applying large pushes at once restore them in order. A
// gcRelaxation holds it from its start to its end.
var gcSettingsMu sync.Mutex

// A gcRelaxation is the relaxed collector of one push, from its start
// (relaxGC, relaxGCForWire) to end. A nil *gcRelaxation relaxes nothing,
// and its methods do nothing: that is what a small push gets, at no cost.
//
// Invariants:
//   - gcSettingsMu is held from the start to end, so that a second
//     relaxation started before the first ends waits for it: a push must
//     pass its relaxation on (extend), never start another.
//   - end restores the previous settings the first time only; ended
//     counts its calls, so that tests can tell a relaxation ended exactly
//     once.
//   - One goroutine at a time uses it: the one receiving and applying the
//     push.
type gcRelaxation struct {
	percent int    // GOGC before the push
	limit   int64  // memory limit before the push
	heap    uint64 // live heap at the start
	n       int    // resources the memory cap allows for
	ended   int    // calls of end
}

// relaxGC relaxes the collector for a push of n resources, if it is large,
// and returns the relaxation, or nil.
func relaxGC(n int) *gcRelaxation {
	if n < relaxGCMin {
		return nil
	}
	return startRelaxation(n)
}

// relaxGCForWire relaxes the collector for a response of size bytes on the
// wire, if it is large, before it is unmarshalled, and returns the
// relaxation, or nil.
func relaxGCForWire(size int) *gcRelaxation {
	if size < relaxGCMinBytes {
		return nil
	}
	return startRelaxation(size / typicalResourceBytes)
}

// startRelaxation relaxes the collector for a push of n resources, unless
// GOGC is already relaxedGCPercent or higher (or off), and returns the
// relaxation, or nil.
func startRelaxation(n int) *gcRelaxation {
	gcSettingsMu.Lock()
	percent := debug.SetGCPercent(relaxedGCPercent)
	if percent < 0 || percent >= relaxedGCPercent {
		debug.SetGCPercent(percent)
		gcSettingsMu.Unlock()
		return nil
	}
	r := &gcRelaxation{percent: percent, limit: debug.SetMemoryLimit(-1), heap: liveHeap(), n: n}
	debug.SetMemoryLimit(min(r.limit, memoryCap(r.heap, n)))
	return r
}

// extend returns the relaxation for a push of n resources: r, with its
// memory cap raised if n is more than it allows for, or, if r is nil, a
// relaxation of its own (relaxGC).
func (r *gcRelaxation) extend(n int) *gcRelaxation {
	if r == nil {
		return relaxGC(n)
	}
	if r.ended == 0 && n > r.n {
		r.n = n
		debug.SetMemoryLimit(min(r.limit, memoryCap(r.heap, n)))
	}
	return r
}

// end restores the settings in force before r started. Only its first call
// does anything.
func (r *gcRelaxation) end() {
	if r == nil {
		return
	}
	r.ended++
	if r.ended > 1 {
		return
	}
	debug.SetMemoryLimit(r.limit)
	debug.SetGCPercent(r.percent)
	gcSettingsMu.Unlock()
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
