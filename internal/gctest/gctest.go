// Package gctest measures the garbage collector in benchmarks. Only tests
// import it.
package gctest

import (
	"runtime"
	"runtime/metrics"
	"testing"
)

// markSamples are the runtime's mark CPU classes: assists, dedicated and
// idle workers (fractional workers count as dedicated).
var markSamples = []string{
	"/cpu/classes/gc/mark/assist:cpu-seconds",
	"/cpu/classes/gc/mark/dedicated:cpu-seconds",
	"/cpu/classes/gc/mark/idle:cpu-seconds",
}

// markSeconds returns the mark CPU the process has spent so far.
func markSeconds() float64 {
	s := make([]metrics.Sample, len(markSamples))
	for i, name := range markSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	var total float64
	for _, x := range s {
		total += x.Value.Float64()
	}
	return total
}

// ReportMarkCPU runs b's loop as forced collections, after one to start
// from a collected heap, and reports their mark CPU per collection as
// mark-ms/gc. keep is what must stay live (the heap being measured).
func ReportMarkCPU(b *testing.B, keep any) {
	b.Helper()
	runtime.GC()
	m0 := markSeconds()
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric((markSeconds()-m0)*1e3/float64(b.N), "mark-ms/gc")
	runtime.KeepAlive(keep)
}
