package xds

import (
	"math"
	"runtime/debug"
	"testing"
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
		restore := relaxGC(relaxGCMin - 1)
		if p, l := gcSettings(); p != 100 || l != math.MaxInt64 {
			t.Errorf("during a small push: GOGC %d, limit %d; want unchanged", p, l)
		}
		restore()
	})

	t.Run("large push", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		const n = 100_000
		restore := relaxGC(n)
		p, l := gcSettings()
		if p != relaxedGCPercent {
			t.Errorf("during a large push: GOGC %d, want %d", p, relaxedGCPercent)
		}
		if floor := int64(relaxedHeapSlack + n*relaxedPerResource); l < floor || l == math.MaxInt64 {
			t.Errorf("during a large push: memory limit %d, want a cap of at least %d", l, floor)
		}
		restore()
		if p, l := gcSettings(); p != 100 || l != math.MaxInt64 {
			t.Errorf("after the push: GOGC %d, limit %d; want 100 and no limit back", p, l)
		}
	})

	t.Run("operator limit kept when lower", func(t *testing.T) {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(64 << 20)
		restore := relaxGC(relaxGCMin)
		if _, l := gcSettings(); l != 64<<20 {
			t.Errorf("memory limit %d during a push, want the operator's %d", l, 64<<20)
		}
		restore()
		if _, l := gcSettings(); l != 64<<20 {
			t.Errorf("memory limit %d after a push, want %d", l, 64<<20)
		}
	})

	for _, gogc := range []int{-1, relaxedGCPercent, 1000} {
		debug.SetGCPercent(gogc)
		debug.SetMemoryLimit(math.MaxInt64)
		restore := relaxGC(relaxGCMin * 10)
		if p, l := gcSettings(); p != gogc || l != math.MaxInt64 {
			t.Errorf("GOGC=%d: during a push GOGC %d, limit %d; want unchanged", gogc, p, l)
		}
		restore()
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
