package xds

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// lowPriorityNice is the nice value of the thread that decodes and applies
// a push: the lowest, so that on a busy node the kernel runs data-path
// threads first (a 100,000-workload push is about a second of CPU). A small
// push (a policy change) still takes microseconds; only large pushes wait
// when the node is saturated. Measured with gozt bench --quick --scenario
// xds-push, three interleaved runs each: longest stall of a live connection
// 33–43 ms at normal priority, 24–27 ms with this.
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
		// Lowering one's own priority needs no privilege; if it fails the
		// push is simply applied at normal priority.
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), lowPriorityNice)
		fn()
	}()
	<-done
}
