package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gozt/gozt/proxy/telemetry"
)

// What an accept loop does when Accept fails with anything but a closed
// listener or a timeout (TESTPLAN F21).
//
// Out of file descriptors (EMFILE, ENFILE) the connection stays in the
// kernel's accept queue, where its client waits, its handshake complete,
// for an answer that may never come. A short exhaustion (a burst whose
// failing upstream dials give their descriptors back at once) passes: the
// loop backs off for acceptBackoff and tries again, shedAfter times. If
// the descriptors are still gone then, the loop sheds: each Proxy keeps
// one spare descriptor, whose slot it gives up only while a connection is
// queued (accept_linux.go), to accept what is queued and reset it at once
// (SO_LINGER 0), then takes back. The client reads a reset instead of
// hanging. The slot is free for the few system calls between the spare's
// close and the first accept, and between the last reset and the spare's
// reopening; another goroutine's socket or accept can take it only then,
// and the spare is lost until a descriptor is freed. A call that fails
// holds the slot only for a moment, so the reopening is tried a few times
// (retakeSpareLocked). Giving the slot up while nothing was queued, waiting
// for a connection, lost the spare within a second in two runs of
// seventeen of TestFDExhaustion: the healthy connections then held every
// descriptor and the queue waited for ever. Without a spare, the queue is
// reset without a descriptor: the listening socket stops and starts
// listening again (accept_linux.go, resetQueue). On any other
// error, and when nothing is queued, the loop backs off, so that it never
// spins. A successful Accept takes the spare back; the streak of failures,
// and with it the shedding, ends only once a second passes without a
// failed accept (admission.Hooks.Failed), since at the limit one accept
// now and then gets through between failures.
//
// Failures are logged at most once per acceptLogEvery per listener, with
// the number of connections shed and failures not logged since the last
// line.
const (
	acceptBackoff  = 50 * time.Millisecond
	shedAfter      = 4  // backoffs, about 200 ms of exhaustion, before shedding
	shedBatch      = 64 // queued connections reset per shed, at most
	acceptLogEvery = time.Second
)

// acceptGuard is a Proxy's spare descriptor and its accept-failure log
// state.
type acceptGuard struct {
	// spent is set while spare is nil, so that a successful Accept, which
	// checks it without the lock, takes the spare back (reacquire).
	spent atomic.Bool

	mu    sync.Mutex
	spare *os.File // or nil while given up
	// Per listener name, since its last log line.
	lastLog map[string]time.Time
	shed    map[string]int
	failed  map[string]int
}

// openSpareLocked takes the spare descriptor if it is not held; it
// reports whether it is held afterwards.
func (g *acceptGuard) openSpareLocked() bool {
	if g.spare == nil {
		f, err := openSpareFile()
		if err != nil {
			g.spent.Store(true)
			return false
		}
		g.spare = f
		g.spent.Store(false)
	}
	return true
}

// openSpareFile opens a spare descriptor, /dev/null; tests replace it to
// take the spare away. It opens with open(2) and wraps the descriptor with
// os.NewFile, which leaves it out of the runtime's poller: os.Open offers
// every file to the poller, and for a character device that costs five
// system calls more (epoll_ctl refused with EPERM, four fcntl) on each
// Listen, so on each pod's ZDS Add in shared mode.
var openSpareFile = func() (*os.File, error) {
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	return os.NewFile(uintptr(fd), os.DevNull), nil
}

// accepted takes the spare descriptor back if it was given up: a
// successful Accept ends the shedding.
func (g *acceptGuard) accepted() {
	if g.spent.Load() {
		g.reacquire()
	}
}

// reacquire takes the spare descriptor back after it was given up.
func (g *acceptGuard) reacquire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openSpareLocked()
}

// closeSpare releases the spare descriptor (Shutdown).
func (g *acceptGuard) closeSpare() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.spare != nil {
		g.spare.Close()
		g.spare = nil
	}
	g.spent.Store(false) // closed for good
}

// isFDExhausted reports whether err is the process or the system running
// out of file descriptors.
func isFDExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// acceptFailed handles a failed Accept on listener name's l, the
// failures-th in a row (see above).
func (p *Proxy) acceptFailed(l net.Listener, name string, err error, failures int) {
	sustained := isFDExhausted(err) && failures > shedAfter
	if sustained {
		p.cfg.Admission.NoteFDExhausted() // readiness (package admission)
	}
	n := 0
	if sustained {
		n = p.accept.shedQueued(l)
	}
	shed := n > 0
	if shed {
		p.cfg.Metrics.Shed(name, telemetry.ShedFDExhausted).Add(float64(n))
	}
	g := &p.accept
	g.mu.Lock()
	if g.lastLog == nil {
		g.lastLog, g.shed, g.failed = map[string]time.Time{}, map[string]int{}, map[string]int{}
	}
	if shed {
		g.shed[name] += n
	} else {
		g.failed[name]++
	}
	now := time.Now()
	logIt := now.Sub(g.lastLog[name]) >= acceptLogEvery
	nShed, nFailed := g.shed[name], g.failed[name]
	if logIt {
		g.lastLog[name], g.shed[name], g.failed[name] = now, 0, 0
	}
	g.mu.Unlock()
	if logIt {
		p.log.Warn("accept failed", "listener", name, "addr", l.Addr(), "error", err,
			"shed", nShed, "failures", nFailed)
	}
	if !shed {
		time.Sleep(acceptBackoff) // do not spin
	}
}
