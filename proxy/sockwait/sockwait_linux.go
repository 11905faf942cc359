package sockwait

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supported reports whether sockets can park here.
const supported = true

// events is what a parked socket waits for: bytes or a connection to
// accept, the peer's FIN (EPOLLRDHUP), and, always reported, errors and
// hang-ups; one event, then the socket is disarmed until its next Park
// (EPOLL_CTL_MOD).
const events = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// epollSet is a Set's epoll descriptor, non-blocking and wrapped in an
// *os.File, so that the Set's goroutine waits for it in the runtime's
// poller, like for a socket, instead of holding a thread in epoll_wait.
type epollSet struct {
	f  *os.File
	rc syscall.RawConn
}

// startLocked makes s's epoll set and starts its loop, if s has none. It
// reports whether s has a set; making one fails when the process is out of
// descriptors, and then the caller waits on its goroutine and the next
// Park tries again.
func (s *Set) startLocked() bool {
	if s.ep != nil {
		return true
	}
	ep, err := newEpollSet()
	if err != nil {
		return false
	}
	s.ep = ep
	go s.loop(ep)
	return true
}

func newEpollSet() (*epollSet, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(fd), "sockwait-epoll")
	// Only a file in the runtime's poller takes deadlines; one that is not
	// would make the loop spin.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &epollSet{f: f, rc: rc}, nil
}

// arm adds w's socket to the set, or re-arms it, for one event. The socket's
// descriptor is used inside Control only, which fails once it is closed.
func (ep *epollSet) arm(w *Watch) error {
	op := unix.EPOLL_CTL_MOD
	if !w.added {
		op = unix.EPOLL_CTL_ADD
	}
	ev := unix.EpollEvent{Events: events, Fd: w.slot, Pad: int32(w.gen)}
	var cerr error
	if err := w.rc.Control(func(fd uintptr) { cerr = ep.ctl(op, int(fd), &ev) }); err != nil {
		return err
	}
	return cerr
}

// remove takes w's socket out of the set. It fails only if the socket is
// closed, which removed it already.
func (ep *epollSet) remove(w *Watch) {
	_ = w.rc.Control(func(fd uintptr) {
		_ = ep.ctl(unix.EPOLL_CTL_DEL, int(fd), &unix.EpollEvent{})
	})
}

// ctl is epoll_ctl on the set, its own descriptor likewise used inside
// Control so that a concurrent Close cannot have it reused.
func (ep *epollSet) ctl(op, fd int, ev *unix.EpollEvent) error {
	var err error
	if cerr := ep.rc.Control(func(epfd uintptr) { err = unix.EpollCtl(int(epfd), op, fd, ev) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

func (ep *epollSet) close() error { return ep.f.Close() }

// loop is the Set's goroutine: it waits for events and starts the wakes
// they are for. It ends when the set is closed (Close); if the set fails
// otherwise, the Set closes and every parked loop goes back to a goroutine.
func (s *Set) loop(ep *epollSet) {
	var evs [64]unix.EpollEvent
	for {
		var n int
		var werr error
		err := ep.rc.Read(func(fd uintptr) bool {
			for {
				n, werr = unix.EpollWait(int(fd), evs[:], 0)
				if werr != unix.EINTR {
					return n > 0 || werr != nil
				}
			}
		})
		s.mu.Lock()
		if err != nil || werr != nil {
			if !s.closed {
				s.closed = true
				s.handBackLocked()
				_ = ep.close()
			}
			s.mu.Unlock()
			return
		}
		for _, ev := range evs[:n] {
			s.fireLocked(ev.Fd, uint32(ev.Pad))
		}
		s.mu.Unlock()
	}
}
