package hbone

import (
	"context"
	"net/http"
	"runtime"
	"testing"
)

// TestIdleStreamMemory measures the heap held per idle tunnel (both ends,
// excluding goroutine stacks) and checks it against a budget.
func TestIdleStreamMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("memory measurement")
	}
	release := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		s.Close()
	}, pairOpts{srv: Config{MaxConcurrentStreams: 2000}, cli: Config{MaxConcurrentStreams: 2000}})
	defer close(release)
	const n = 1000
	streams := make([]*ClientStream, 0, n)
	// Warm up pools and maps.
	for range 10 {
		s := p.connect(context.Background())
		s.Write([]byte("x"))
		streams = append(streams, s)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		s := p.connect(context.Background())
		streams = append(streams, s)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	t.Logf("heap per idle tunnel (client + server, no stacks): %d bytes", per)
	if per > 4<<10 {
		t.Errorf("idle tunnel holds %d bytes of heap, budget 4 KiB", per)
	}
	for _, s := range streams {
		s.Close()
	}
}
