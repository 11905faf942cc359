package local

import (
	"fmt"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"testing"
)

// memClasses are the runtime/metrics samples the soak reports, each with
// the short name its log line gives it: where the process's memory is, in
// Go's own accounting, beside the kernel's RSS.
var memClasses = []struct{ name, metric string }{
	{"live", "/gc/heap/live:bytes"},                      // heap marked live by the last GC
	{"objects", "/memory/classes/heap/objects:bytes"},    // live plus dead not yet swept
	{"idle", "/memory/classes/heap/free:bytes"},          // free heap spans still mapped
	{"released", "/memory/classes/heap/released:bytes"},  // free heap spans returned to the OS
	{"stacks", "/memory/classes/heap/stacks:bytes"},      // goroutine stacks
	{"os-stacks", "/memory/classes/os-stacks:bytes"},     // threads' system stacks
	{"unused", "/memory/classes/heap/unused:bytes"},      // fragmentation inside spans
	{"metadata", "/memory/classes/metadata/other:bytes"}, // runtime metadata
	{"total", "/memory/classes/total:bytes"},             // all Go maps, released included
}

// memReport is one line of Go's memory classes, in MiB, with the RSS and
// the thread count the kernel reports.
func memReport() string {
	samples := make([]metrics.Sample, len(memClasses))
	for i, c := range memClasses {
		samples[i].Name = c.metric
	}
	metrics.Read(samples)
	var b strings.Builder
	fmt.Fprintf(&b, "RSS %.1f MiB, threads %d;", float64(readProcStats().rssKiB)/1024, threadCount())
	for i, c := range memClasses {
		fmt.Fprintf(&b, " %s %.1f", c.name, float64(samples[i].Value.Uint64())/(1<<20))
	}
	return b.String()
}

// threadCount is the process's thread count, from /proc/self/status.
func threadCount() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			var n int
			fmt.Sscan(strings.TrimSpace(v), &n)
			return n
		}
	}
	return 0
}

// writeSoakHeapProfile writes the heap profile to the file
// SOAK_HEAP_PROFILE names, if it is set: what the heap holds after the
// soak, for `go tool pprof -sample_index=inuse_space`.
func writeSoakHeapProfile(t *testing.T) {
	path := os.Getenv("SOAK_HEAP_PROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		t.Errorf("heap profile: %v", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Errorf("heap profile: %v", err)
	}
}
