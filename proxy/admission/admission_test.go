package admission

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestAdmissionWatermarks: new connections are refused once the sampled
// memory passes the high-water mark, stay refused between the marks, and
// are admitted again only below the low-water mark; nothing changes
// between samples.
func TestAdmissionWatermarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var used atomic.Uint64
		a := New(Config{MemoryLimit: 1000, Interval: 100 * time.Millisecond})
		a.read = used.Load
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- a.Run(ctx) }()
		step := func(mem uint64, want bool) {
			t.Helper()
			used.Store(mem)
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			if got := a.MemoryPressure(); got != want {
				t.Errorf("memory %d of 1000: MemoryPressure() = %v, want %v", mem, got, want)
			}
		}
		time.Sleep(time.Millisecond) // between ticks
		step(800, false)             // under the high-water mark (850)
		step(900, true)
		step(800, true) // between the marks: still refusing
		step(760, true)
		step(700, false) // under the low-water mark (750)
		step(800, false)
		used.Store(2000)
		time.Sleep(50 * time.Millisecond) // half an interval: not sampled yet
		if a.MemoryPressure() {
			t.Error("MemoryPressure() changed between samples")
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// TestAdmissionOff: with no memory limit Run returns at once and nothing
// is ever refused; a nil Controller refuses nothing either.
func TestAdmissionOff(t *testing.T) {
	a := New(Config{})
	a.read = func() uint64 { return 1 << 62 }
	if err := a.Run(context.Background()); err != nil || a.MemoryPressure() {
		t.Errorf("Run = %v, MemoryPressure() = %v; want nil, false", err, a.MemoryPressure())
	}
	var none *Controller
	if none.MemoryPressure() || none.FDExhausted() {
		t.Error("a nil Controller reports pressure")
	}
	none.NoteFDExhausted() // no panic
}

// TestFDExhaustedHold: readiness reports a descriptor exhaustion for
// fdReadyHold after the last one, and each new one extends it.
func TestFDExhaustedHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := New(Config{})
		if a.FDExhausted() {
			t.Fatal("FDExhausted() before any exhaustion")
		}
		a.NoteFDExhausted()
		time.Sleep(fdReadyHold - 100*time.Millisecond)
		if !a.FDExhausted() {
			t.Errorf("FDExhausted() = false %v after an exhaustion", fdReadyHold-100*time.Millisecond)
		}
		a.NoteFDExhausted()
		time.Sleep(fdReadyHold - 100*time.Millisecond)
		if !a.FDExhausted() {
			t.Error("a second exhaustion did not extend the hold")
		}
		time.Sleep(200 * time.Millisecond)
		if a.FDExhausted() {
			t.Errorf("FDExhausted() still true %v after the last exhaustion", fdReadyHold+100*time.Millisecond)
		}
	})
}

// TestReadMemory: the sampled memory grows with memory held live and
// stays within what the runtime has mapped.
func TestReadMemory(t *testing.T) {
	runtime.GC() // what an earlier test (or -count run) left live is in before
	before := readMemory()
	hold := make([][]byte, 64)
	for i := range hold {
		hold[i] = make([]byte, 1<<20)
		hold[i][0] = 1
	}
	runtime.GC() // the live heap is measured by a collection
	after := readMemory()
	if after < before+48<<20 {
		t.Errorf("readMemory() = %d with 64 MiB more held live, %d before; want at least 48 MiB more", after, before)
	}
	hold[0][0] = 2 // hold is live through the read
}

// TestAdmissionBlockReadiness: BlockReadiness registers one blocker for
// descriptor exhaustion and one for memory pressure, each true exactly while
// its condition holds.
func TestAdmissionBlockReadiness(t *testing.T) {
	a := New(Config{})
	blockers := map[string]func() bool{}
	a.BlockReadiness(func(name string, blocked func() bool) { blockers[name] = blocked })
	fds, mem := blockers["file descriptors exhausted"], blockers["memory pressure"]
	if len(blockers) != 2 || fds == nil || mem == nil {
		t.Fatalf("blockers %v, want file descriptors exhausted and memory pressure", slices.Sorted(maps.Keys(blockers)))
	}
	if fds() || mem() {
		t.Fatalf("a fresh Controller blocks readiness: fds %v, memory %v", fds(), mem())
	}
	a.NoteFDExhausted()
	if !fds() || mem() {
		t.Errorf("after descriptor exhaustion: fds %v, memory %v; want true, false", fds(), mem())
	}
	a.shedding.Store(true)
	if !mem() {
		t.Error("while shedding for memory the memory blocker is false")
	}
}
