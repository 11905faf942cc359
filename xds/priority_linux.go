package xds

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// lowPriorityNice is the nice value of the thread that decodes and applies
// a large push, with Config.TunePushes (lowPriorityMin resources or more; its unmarshal too, from
// relaxGCMinBytes): the lowest, so that on a busy node the kernel runs
// data-path threads first (a 100,000-workload push is about a second of
// CPU). A small push (a policy change) runs at normal priority.
// Measurements: bench/NOTES.md, "Why a large push runs at low priority".
const lowPriorityNice = 19

// runLowPriority runs fn on an OS thread of its own whose scheduling
// priority is lowered. Linux keeps nice values per thread; the goroutine
// never unlocks the thread, so the thread exits with it and the lowered
// priority never reaches another goroutine.
func runLowPriority(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		lowerThreadPriority()
		fn()
	}()
	<-done
}

// lowSlice is the time slice the low-priority thread asks the kernel for.
// Linux's EEVDF scheduler (6.6 and later) lets a running thread finish its
// slice before a thread that wakes up takes the CPU, whatever their nice
// values: with the default slice (1.4 ms on a 2-core node) a data-path
// thread woken while the push's thread ran waited up to that long, and
// several such waits in a row made the longest stalls (perf sched
// timehist, gozt bench's xds-push scenario). Since Linux 6.12 a thread may
// ask for a shorter slice (sched_setattr's sched_runtime, 0.1–100 ms); the
// shortest bounds that wait at 0.1 ms. It changes the thread's turns, not
// its share of the CPU, which nice sets. Older kernels ignore the request.
// Measurements: bench/NOTES.md, "Why a large push runs at low priority".
const lowSlice = 100 * time.Microsecond

// lowerThreadPriority gives the calling thread nice lowPriorityNice and the
// slice lowSlice. Lowering one's own priority needs no privilege; if it
// fails the push is simply applied at normal priority.
func lowerThreadPriority() {
	attr := unix.SchedAttr{Policy: unix.SCHED_NORMAL, Nice: lowPriorityNice, Runtime: uint64(lowSlice)}
	if unix.SchedSetAttr(0, &attr, 0) != nil {
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), lowPriorityNice)
	}
}
