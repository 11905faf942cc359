// Package workers runs short tasks on goroutines that outlive them, so a
// task starts on a stack that an earlier task has already grown.
//
// A goroutine starts on a small stack (the runtime's average, often 2 KiB)
// and doubles it, copying every frame, each time a call runs out of room.
// A connection's handler goes deep once (a TLS record write, a dial, the
// record of a finished connection) and then returns: on a fresh goroutine
// each connection pays two or three of those copies, 7–10% of a proxy's CPU
// in the connect-rate benchmark. Go hands f to a worker that is waiting for
// one, or starts a new goroutine if none is; a worker waits for the next
// task up to Linger and then exits, and at most Idle of them wait at once,
// so the stacks kept are few and bounded.
//
// Only tasks that end soon belong here: a task that waits for a long time
// (an idle connection's reader) would keep a grown stack for all that time.
package workers

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Pool is a set of waiting workers. The zero value is not usable; use New.
type Pool struct {
	tasks  chan func()
	idle   atomic.Int32 // workers waiting, or about to
	max    int32
	linger time.Duration
}

// New returns a pool that keeps at most idle workers waiting, each for at
// most linger. idle ≤ 0 means four per GOMAXPROCS, read when a worker
// finishes a task (the process may set GOMAXPROCS after New, as gozt does
// from ZTUNNEL_WORKER_THREADS).
func New(idle int, linger time.Duration) *Pool {
	return &Pool{tasks: make(chan func()), max: int32(max(idle, 0)), linger: linger}
}

// Default is the pool of the process's connection handlers: four waiting
// workers per GOMAXPROCS at most, each for at most a second.
var Default = New(0, time.Second)

// idleCap is how many workers may wait at once.
func (p *Pool) idleCap() int32 {
	if p.max > 0 {
		return p.max
	}
	return int32(4 * runtime.GOMAXPROCS(0))
}

// Go runs f on a waiting worker, or on a new goroutine if none is waiting.
// Like a go statement it does not wait for f; unlike one, f may run on a
// goroutine that ran other tasks before (so f must not rely on
// goroutine-local state such as pprof labels set by its caller).
func (p *Pool) Go(f func()) {
	select {
	case p.tasks <- f:
	default:
		go p.work(f)
	}
}

// work runs f, then the tasks handed to it while it waits.
func (p *Pool) work(f func()) {
	f()
	var t *time.Timer
	for p.idle.Add(1) <= p.idleCap() {
		if t == nil {
			t = time.NewTimer(p.linger)
		} else {
			t.Reset(p.linger)
		}
		select {
		case f = <-p.tasks:
			p.idle.Add(-1)
			f()
		case <-t.C:
			p.idle.Add(-1)
			return
		}
	}
	p.idle.Add(-1)
}

// IdleTop is the function at the top of a waiting worker's stack, for leak
// checks in tests to ignore (goleak.IgnoreTopFunction): a waiting worker is
// kept on purpose and exits after its linger. A task that never returns
// still shows up, with its own function on top.
const IdleTop = "github.com/gozt/gozt/internal/workers.(*Pool).work"
