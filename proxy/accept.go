package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
// one spare descriptor, which it gives up to accept one queued connection
// and reset it at once (SO_LINGER 0), then takes back. The client reads a
// reset instead of hanging, and the loop sheds the queue as fast as
// clients fill it, not faster: an Accept that finds nothing queued waits
// at most shedWait. Without a spare (another goroutine took the freed
// descriptor first) and on any other error, the loop backs off, so that
// it never spins. The first successful Accept ends the shedding.
//
// Failures are logged at most once per acceptLogEvery per listener, with
// the number of connections shed and failures not logged since the last
// line.
const (
	acceptBackoff  = 50 * time.Millisecond
	shedAfter      = 4 // backoffs, about 200 ms of exhaustion, before shedding
	shedWait       = 50 * time.Millisecond
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
		f, err := os.Open(os.DevNull)
		if err != nil {
			g.spent.Store(true)
			return false
		}
		g.spare = f
		g.spent.Store(false)
	}
	return true
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
		p.cfg.Admission.noteFDExhausted() // readiness (admission.go)
	}
	shed := sustained && p.shedOne(l)
	if shed {
		p.cfg.Metrics.shed.WithLabelValues(name, shedFDExhausted).Inc()
	}
	g := &p.accept
	g.mu.Lock()
	if g.lastLog == nil {
		g.lastLog, g.shed, g.failed = map[string]time.Time{}, map[string]int{}, map[string]int{}
	}
	if shed {
		g.shed[name]++
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

// shedOne accepts one queued connection on l with the spare descriptor and
// resets it; it reports whether it did.
func (p *Proxy) shedOne(l net.Listener) bool {
	g := &p.accept
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.spare == nil && !g.openSpareLocked() {
		return false
	}
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return false
	}
	g.spare.Close()
	g.spare = nil
	defer g.openSpareLocked()
	_ = tl.SetDeadline(time.Now().Add(shedWait))
	c, err := tl.AcceptTCP()
	_ = tl.SetDeadline(time.Time{})
	if err != nil {
		return false
	}
	_ = c.SetLinger(0) // a reset: the client must not wait on us
	_ = c.Close()
	return true
}
