package relay

import (
	"net"
	"sync"
	"sync/atomic"
)

// A Poller takes over the wait of idle connections' pulled directions, so
// that an idle connection relayed by Poller.Start has no goroutine at all
// (issue 16, lever 2).
//
// Without it, the direction from a TCP socket opposite a pushing HBONE
// stream (start.go) is a chain of goroutines, and the one an idle connection
// keeps is parked in the runtime's poller: a g and its stack, about 2.5 KB
// or more per connection. With a Poller, once the direction has waited
// idleRespawn without a byte, it registers the socket in a private epoll set
// (EPOLLIN|EPOLLRDHUP|EPOLLONESHOT: readable, peer's FIN, error or hang-up)
// and its goroutine exits. The Poller's one goroutine waits on that set
// (itself through the runtime's poller: an epoll descriptor is readable while
// it has events, so no thread is held) and, when a socket becomes readable,
// starts a fresh goroutine that runs the direction as before: it copies,
// waits up to idleRespawn for more in the runtime's poller (so a busy
// connection does not pay an epoll_ctl per burst), then re-arms the socket
// with EPOLL_CTL_MOD and exits. The socket stays registered in the runtime's
// poller too; the private set only watches it.
//
// Soundness:
//
//   - A readiness that comes before the re-arm is not lost: epoll looks at a
//     level-triggered socket when it is added or modified and queues an
//     event at once if it is readable.
//   - The descriptor is only ever used inside syscall.RawConn.Control (the
//     epoll_ctl calls) or Read (the copy), during which the net package keeps
//     it open, so a closed descriptor number reused by another socket is
//     never touched. Events name a slot and a generation, not a descriptor,
//     so a late event for a closed connection is dropped.
//   - Nobody waits on a parked socket, so a Close of it from elsewhere would
//     end nothing: the kernel drops a closed socket from the set without an
//     event. So every close of a leg that may be parked goes through the
//     Poller (CloseConn; the relay's own aborts do): it takes the socket out
//     of the set (EPOLL_CTL_DEL, before the close), closes it, and hands the
//     direction back to a goroutine, which finds the socket closed and ends
//     the copy exactly as a direction waiting in the runtime's poller does
//     when its socket is closed, with the same Result and error.
//   - Any failure to register, and a closed Poller, fall back to today's
//     goroutine wait; the epoll path is Linux only (park_linux.go), and other
//     systems always wait on a goroutine.
//
// Its zero value is not usable; a nil *Poller is, and parks nothing.
type Poller struct {
	closed atomic.Bool

	mu      sync.Mutex
	ep      *epollSet                // the private set, made at the first park; nil before, and while making it fails
	failed  bool                     // closed, or its set failed after it was made: park nothing
	setErrs int                      // how many times making the set failed
	slots   []*parker                // by slot, nil when free
	free    []int32                  // free slots
	gen     uint32                   // the last parker generation given out
	byConn  map[*net.TCPConn]*parker // every registered socket

	beforeClose func() // tests only: runs in closeWith just before the close
}

// parker is the parked state of one pulled direction: 40 bytes, about 70
// with its slot and map entry, against a goroutine's 2.5 KB or more. Its
// fields are guarded by the Poller's mu.
type parker struct {
	h     *half
	r     *sockReader
	tcp   *net.TCPConn
	slot  int32
	gen   uint32 // counts the slot's uses, so that a late event for a former occupant is dropped
	added bool   // the socket is in the epoll set
	armed bool   // waiting for an event; false while a goroutine runs the direction
}

// NewPoller returns a Poller. It makes no descriptor and starts no goroutine
// until the first connection parks; Close releases them.
func NewPoller() *Poller {
	return &Poller{byConn: map[*net.TCPConn]*parker{}}
}

// usable reports whether p may take waits over now.
func (p *Poller) usable() bool {
	return p != nil && parkSupported && !p.closed.Load()
}

// park registers h's source, which r reads, and arms it. It reports
// whether it did; if so, h's goroutine must return at once, and a new one
// runs h.pull when the socket is readable, or when it is closed through p.
// If not, the caller waits on its goroutine as without a Poller.
func (p *Poller) park(h *half, r *sockReader) bool {
	if !p.usable() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() || !p.startLocked() {
		return false
	}
	pk := h.pk
	if pk == nil {
		pk = &parker{h: h, r: r, tcp: h.src().(*net.TCPConn)}
		p.addLocked(pk)
		h.pk = pk
	}
	if err := p.ep.arm(pk); err != nil {
		// Closed, most likely: the goroutine's own wait reports it.
		p.removeLocked(pk)
		return false
	}
	pk.added, pk.armed = true, true
	return true
}

// addLocked gives pk a slot and indexes it by socket.
func (p *Poller) addLocked(pk *parker) {
	if n := len(p.free); n > 0 {
		pk.slot = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		pk.slot = int32(len(p.slots))
		p.slots = append(p.slots, nil)
	}
	p.slots[pk.slot] = pk
	p.gen++
	pk.gen = p.gen
	p.byConn[pk.tcp] = pk
}

// removeLocked takes pk's socket out of the epoll set, if it is in it, and
// frees its slot. The direction no longer has a parker.
func (p *Poller) removeLocked(pk *parker) {
	if pk.added && p.ep != nil {
		p.ep.remove(pk) // fails only when the socket is closed, which removed it
	}
	pk.added, pk.armed = false, false
	if p.slots[pk.slot] == pk {
		p.slots[pk.slot] = nil
		p.free = append(p.free, pk.slot)
	}
	delete(p.byConn, pk.tcp)
	pk.h.pk = nil
}

// wake runs the direction of the parker in slot, if it is still the one the
// event was for and is armed: the event is one-shot, so the socket stays
// disarmed until the direction parks again.
func (p *Poller) wake(slot int32, gen uint32) {
	if slot < 0 || int(slot) >= len(p.slots) {
		return
	}
	pk := p.slots[slot]
	if pk == nil || pk.gen != gen || !pk.armed {
		return
	}
	pk.armed = false
	go pk.h.pullReadable(pk.r)
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
// parked in p is first taken out of its epoll set, and after the close its
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
// socket can no longer be armed (arm's Control fails). Closing a
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
	parked := pk != nil && pk.armed
	if pk != nil {
		p.removeLocked(pk) // before the close: deregister, then close
	}
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
// own (as without a Poller), and its descriptor and goroutine are released.
// Copies p starts afterwards do not park.
func (p *Poller) Close() error {
	if p == nil || p.closed.Swap(true) {
		return nil
	}
	p.handBack()
	return nil
}

// handBack takes every parked direction out of p and runs it on a goroutine
// of its own, then closes the epoll set.
func (p *Poller) handBack() {
	p.mu.Lock()
	var back []*parker
	for _, pk := range p.slots {
		if pk != nil {
			if pk.armed {
				back = append(back, pk)
			}
			p.removeLocked(pk)
		}
	}
	ep := p.ep
	p.ep = nil
	p.failed = true
	p.mu.Unlock()
	if ep != nil {
		ep.close()
	}
	for _, pk := range back {
		go pk.h.pull(pk.r)
	}
}

// Parked returns how many connections are parked in p now: their pulled
// direction waits in p's epoll set, with no goroutine.
func (p *Poller) Parked() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, pk := range p.slots {
		if pk != nil && pk.armed {
			n++
		}
	}
	return n
}
