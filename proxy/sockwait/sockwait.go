// Package sockwait lets a socket that nobody is reading wait without a
// goroutine of its own.
//
// A node-wide gozt serves about 110 pods in shared mode, each with its
// listeners and DNS sockets. A goroutine blocked in Accept or ReadFrom costs
// a g and its stack, about 3 KB, for every idle socket of every pod (issue
// 40). A Set is one epoll set per process: a loop whose socket has been idle
// for a while parks it there (Watch.Park) and returns; when the socket is
// readable again (a connection to accept, a datagram, an error or a
// hang-up), the Set starts the wake function on a new goroutine, which runs
// the loop again. The socket stays in the runtime's poller too; the Set only
// watches it.
//
// Soundness:
//
//   - A readiness that comes before Park is not lost: epoll looks at a
//     level-triggered socket when it is added or modified and queues an event
//     at once if it is readable.
//   - The descriptor is only used inside syscall.RawConn.Control, during
//     which the net package keeps it open, so a closed descriptor number that
//     another socket reuses is never touched. Events name a slot and a
//     generation, not a descriptor, so a late event for a former watch is
//     dropped.
//   - Nobody waits on a parked socket, so closing it ends no loop: the kernel
//     drops a closed socket from the set without an event. Whoever closes a
//     socket that may be parked calls Unpark first, which tells it whether a
//     wake is still to come (then the woken loop sees the close, as a loop
//     that never parked does) or never will (then the loop is over and
//     nobody else will end it).
//
// Its loop is one goroutine per process, started at the first Park and
// ended when no socket is watched any more; its epoll descriptor is
// non-blocking and waited on through the runtime's poller, so no thread is
// held. Idle relay directions park in it too (proxy/relay's Poller, one
// per proxy, all in the process's Set in shared mode).
package sockwait

import (
	"sync"
	"syscall"
)

// Set watches parked sockets and wakes their loops. A nil *Set parks
// nothing: every Park reports false.
type Set struct {
	mu     sync.Mutex
	ep     *epollSet // made at the first Park
	closed bool
	slots  []*Watch // by slot, nil when free
	free   []int32
	inUse  int // slots not free
	gen    uint32
}

// New returns a Set. It makes no descriptor and starts no goroutine until
// the first Park.
func New() *Set { return &Set{} }

// Watch is one socket's place in a Set; its fields are guarded by the Set's
// mu. Its zero value is not usable; a nil *Watch parks nothing.
type Watch struct {
	set   *Set
	rc    syscall.RawConn
	slot  int32  // index in set.slots while registered; -1 otherwise
	gen   uint32 // the slot's generation while registered
	added bool   // the descriptor is in the epoll set
	wake  func() // the pending wake while parked; nil otherwise
	done  bool   // Unpark was called: never park again
}

// Watch returns the Watch of the socket behind rc. It makes no system call.
func (s *Set) Watch(rc syscall.RawConn) *Watch {
	return &Watch{set: s, rc: rc, slot: -1}
}

// Park arms the socket for one readiness (readable, an error or a hang-up):
// then the Set runs wake on a new goroutine, once. It reports whether it
// parked. If not (a nil or closed Set, a closed socket, a Watch already
// unparked, a system call's failure), wake never runs, and the caller goes
// on waiting on its own goroutine. A Watch holds at most one Park at a time.
func (w *Watch) Park(wake func()) bool {
	if w == nil || w.set == nil || !supported {
		return false
	}
	s := w.set
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || w.done || w.wake != nil || !s.startLocked() {
		return false
	}
	if w.slot < 0 {
		s.addLocked(w)
	}
	if err := s.ep.arm(w); err != nil {
		if !w.added {
			s.removeLocked(w)
			s.retireIfIdleLocked()
		}
		return false
	}
	w.added = true
	w.wake = wake
	return true
}

// Unpark takes the socket out of the Set for good; call it before closing
// the socket. It reports true if a Park was pending, whose wake has not
// started and never will: the caller then owns the end of the socket's loop.
// It reports false if nothing was parked or the wake has started: the woken
// goroutine owns the socket's wait.
func (w *Watch) Unpark() bool {
	if w == nil || w.set == nil {
		return false
	}
	s := w.set
	s.mu.Lock()
	defer s.mu.Unlock()
	w.done = true
	pending := w.wake != nil
	w.wake = nil
	if w.added && s.ep != nil {
		s.ep.remove(w)
		w.added = false
	}
	if w.slot >= 0 {
		s.removeLocked(w)
	}
	s.retireIfIdleLocked()
	return pending
}

// retireIfIdleLocked closes the epoll set, which ends the loop, when no
// socket is watched: until the next Park, a process (or a test) whose
// proxies have all shut down holds neither.
func (s *Set) retireIfIdleLocked() {
	if s.inUse == 0 && s.ep != nil && !s.closed {
		_ = s.ep.close()
		s.ep = nil
	}
}

// Close stops the Set: every pending wake runs now, on its own goroutine,
// so that each parked loop goes back to waiting on a goroutine of its own,
// and later Parks report false.
func (s *Set) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.handBackLocked()
	if s.ep != nil {
		return s.ep.close()
	}
	return nil
}

// handBackLocked starts every pending wake: the Set can watch no more.
func (s *Set) handBackLocked() {
	for _, w := range s.slots {
		if w != nil && w.wake != nil {
			wake := w.wake
			w.wake = nil
			go wake()
		}
	}
}

// addLocked gives w a slot and a new generation.
func (s *Set) addLocked(w *Watch) {
	s.inUse++
	s.gen++
	w.gen = s.gen
	if n := len(s.free); n > 0 {
		w.slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.slots[w.slot] = w
		return
	}
	w.slot = int32(len(s.slots))
	s.slots = append(s.slots, w)
}

// removeLocked frees w's slot.
func (s *Set) removeLocked(w *Watch) {
	s.inUse--
	s.slots[w.slot] = nil
	s.free = append(s.free, w.slot)
	w.slot = -1
}

// fireLocked starts the pending wake of the watch in slot with generation gen,
// if it is still there and parked. A oneshot registration is disarmed by
// its event, so the watch stays in the set, disarmed, until its next Park.
func (s *Set) fireLocked(slot int32, gen uint32) {
	if slot < 0 || int(slot) >= len(s.slots) {
		return
	}
	w := s.slots[slot]
	if w == nil || w.gen != gen || w.wake == nil {
		return
	}
	wake := w.wake
	w.wake = nil
	go wake()
}

// Parked reports how many watches have a pending wake (tests and metrics).
func (s *Set) Parked() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.slots {
		if w != nil && w.wake != nil {
			n++
		}
	}
	return n
}
