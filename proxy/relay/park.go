package relay

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/gozt/gozt/proxy/sockwait"
)

// A Poller takes over the wait of idle connections' pulled directions, so
// that an idle connection relayed by Poller.Start has no goroutine at all
// (issue 16, lever 2).
//
// Without it, the direction from a TCP socket opposite a pushing HBONE
// stream (start.go) is a chain of goroutines, and the one an idle connection
// keeps is parked in the runtime's poller: a g and its stack, about 2.5 KB
// or more per connection. With a Poller, once the direction has waited
// idleRespawn without a byte, it parks the socket in a sockwait.Set, an
// epoll set that reports one event per park (readable, the peer's FIN, an
// error or a hang-up), and its goroutine exits. The Set's one goroutine waits on the epoll set (itself
// through the runtime's poller, so no thread is held) and, when a socket
// becomes readable, starts a fresh goroutine that runs the direction as
// before: it copies, waits up to idleRespawn for more in the runtime's poller
// (so a busy connection does not pay an epoll_ctl per burst), then parks the
// socket again and exits. The socket stays registered in the runtime's
// poller too; the Set only watches it.
//
// The mechanism is package sockwait's; a Poller keeps the relay's side of
// it: which directions it parked, how many (Parked), and how to hand them
// back. The Set may be shared: a node-wide gozt has one per process, where
// every pod's Poller, listeners and DNS sockets park (NewPoller), so a pod
// costs no epoll descriptor and no goroutine of its own. A Poller given no
// Set makes a private one.
//
// Soundness:
//
//   - A readiness that comes before the socket is parked again is not lost:
//     epoll looks at a level-triggered socket when it is added or modified
//     and queues an event at once if it is readable (sockwait).
//   - The descriptor is only ever used inside syscall.RawConn.Control (the
//     epoll_ctl calls, in sockwait) or Read (the copy), during which the net
//     package keeps it open, so a closed descriptor number reused by another
//     socket is never touched. Events name a slot and a generation, not a
//     descriptor, so a late event for a closed connection is dropped.
//   - Nobody waits on a parked socket, so a Close of it from elsewhere would
//     end nothing: the kernel drops a closed socket from the set without an
//     event. So every close of a leg that may be parked goes through the
//     Poller (CloseConn; the relay's own aborts do): it takes the socket out
//     of the Set (sockwait.Watch.Unpark, before the close), closes it, and,
//     if no wake is to come, hands the direction back to a goroutine, which
//     finds the socket closed and ends the copy exactly as a direction waiting
//     in the runtime's poller does when its socket is closed, with the same
//     Result and error.
//   - Any failure to park (no descriptor left for the epoll set, a closed
//     Set), and a closed Poller, fall back to today's goroutine wait; parking
//     is Linux only (sockwait, and the sockReader the pulled direction needs),
//     and other systems always wait on a goroutine.
//
// Its zero value is not usable; a nil *Poller is, and parks nothing.
type Poller struct {
	set *sockwait.Set // where p parks: shared, or p's own (own)
	own bool          // set is p's private one: Close closes it

	closed atomic.Bool // also read without mu, by usable

	mu       sync.Mutex
	byConn   map[*net.TCPConn]*parker // every socket with a parker
	parked   int                      // parkers that are armed
	parkErrs int                      // parks that failed (tests)

	beforeClose func() // tests only: runs in closeWith just before the close
}

// parker is the parked state of one pulled direction: 48 bytes, about 160
// with its Watch, its bound wake, its slot in the Set and its map entry,
// against a goroutine's 2.5 KB or more. Its fields are guarded by the
// Poller's mu.
type parker struct {
	h     *half
	r     *sockReader
	tcp   *net.TCPConn
	w     *sockwait.Watch // the socket's place in the Set; unparked for good when pk goes
	wake  func()          // pk.woken, bound once so a park allocates nothing
	armed bool            // counted in Parked: a wake is pending or has just started
}

// NewPoller returns a Poller that parks sockets in set, the process's Set
// shared with whatever else parks there, which p's Close leaves open. If set
// is nil, p makes a Set of its own (sockwait.New), which p's Close closes.
// Either way no descriptor is made and no goroutine started until a
// connection parks, and the Set releases them when none is parked any more.
func NewPoller(set *sockwait.Set) *Poller {
	p := &Poller{set: set, byConn: map[*net.TCPConn]*parker{}}
	if set == nil {
		p.set, p.own = sockwait.New(), true
	}
	return p
}

// usable reports whether p may take waits over now.
func (p *Poller) usable() bool {
	return p != nil && !p.closed.Load()
}

// park parks h's source, which r reads, in p's Set. It reports whether it
// did; if so, h's goroutine must return at once, and a new one runs h.pull
// when the socket is readable, or when it is closed through p. If not, the
// caller waits on its goroutine as without a Poller.
func (p *Poller) park(h *half, r *sockReader) bool {
	if !p.usable() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return false
	}
	pk := h.pk
	if pk == nil {
		pk = &parker{h: h, r: r, tcp: h.src().(*net.TCPConn), w: p.set.Watch(r.rc)}
		pk.wake = pk.woken
		p.byConn[pk.tcp] = pk
		h.pk = pk
	}
	// The wake may start before Park returns; it waits for mu to find pk
	// armed.
	if !pk.w.Park(pk.wake) {
		// The socket is closed, the Set is, or the process is out of
		// descriptors: the goroutine's own wait reports or outlasts it.
		p.parkErrs++
		p.removeLocked(pk)
		return false
	}
	pk.armed = true
	p.parked++
	return true
}

// woken is pk's wake, which the Set runs on a new goroutine once the
// socket is readable (or p's Set closes): it runs the direction.
func (pk *parker) woken() {
	p := pk.h.p.poller
	p.mu.Lock()
	p.disarmLocked(pk)
	p.mu.Unlock()
	pk.h.pullReadable(pk.r)
}

// disarmLocked stops counting pk as parked.
func (p *Poller) disarmLocked(pk *parker) {
	if pk.armed {
		pk.armed = false
		p.parked--
	}
}

// removeLocked takes pk's socket out of the Set for good and drops pk; the
// direction no longer has a parker. It reports whether a wake was pending,
// which now never runs: the caller then owns the direction's next turn.
func (p *Poller) removeLocked(pk *parker) (pending bool) {
	pending = pk.w.Unpark()
	p.disarmLocked(pk)
	delete(p.byConn, pk.tcp)
	pk.h.pk = nil
	return pending
}

// forget drops h's parker when h ends.
func (p *Poller) forget(h *half) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if h.pk != nil {
		p.removeLocked(h.pk)
	}
	p.mu.Unlock()
}

// CloseConn closes c, a leg of a copy p started (or any conn). It must be
// used instead of c.Close for such a leg while the copy may run: a socket
// parked in p is first taken out of its Set, and after the close its
// direction goes back to a goroutine, which sees the socket closed and ends
// the copy as on a conn closed under a wait. A nil p just closes c.
func (p *Poller) CloseConn(c net.Conn) error {
	var err error
	p.closeWith(c, func() { err = c.Close() })
	return err
}

// closeWith runs closeFn, which closes c, after taking c out of p if it is
// registered there, and hands its direction back to a goroutine afterwards
// if it was parked.
//
// For a *net.TCPConn (the only kind of leg that parks) closeFn runs under
// p's lock: otherwise a direction still copying could park the socket
// between the look and the close, and nothing would end it. Once closed, the
// socket can no longer be parked (its Control fails). Closing a
// *net.TCPConn does not block: it only waits for the socket's other users,
// whom the close wakes, and none of them waits for this lock.
func (p *Poller) closeWith(c net.Conn, closeFn func()) {
	tcp, ok := c.(*net.TCPConn)
	if p == nil || !ok {
		closeFn()
		return
	}
	p.mu.Lock()
	pk := p.byConn[tcp]
	// Before the close: out of the Set, then close. A wake that has
	// started already runs the direction, which will find the close.
	parked := pk != nil && p.removeLocked(pk)
	if p.beforeClose != nil {
		p.beforeClose()
	}
	closeFn()
	p.mu.Unlock()
	if parked {
		go pk.h.pull(pk.r)
	}
}

// Close stops p: the directions parked in it go back to goroutines of their
// own (as without a Poller), and its own Set, if it made one, is closed,
// releasing its descriptor and goroutine; a shared Set stays open for its
// other users. Copies p starts afterwards do not park.
func (p *Poller) Close() error {
	if p == nil || p.closed.Swap(true) {
		return nil
	}
	p.mu.Lock()
	var back []*parker
	for _, pk := range p.byConn {
		if p.removeLocked(pk) {
			back = append(back, pk)
		}
	}
	p.mu.Unlock()
	for _, pk := range back {
		go pk.h.pull(pk.r)
	}
	if p.own {
		return p.set.Close() // nothing of p's is in it any more
	}
	return nil
}

// Parked returns how many connections are parked in p now: their pulled
// direction waits in p's Set, with no goroutine. Other users of a shared
// Set are not counted.
func (p *Poller) Parked() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parked
}
