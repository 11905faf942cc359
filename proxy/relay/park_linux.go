package relay

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// parkSupported reports whether idle directions can park in a Poller.
const parkSupported = true

// parkEvents is what a parked socket waits for: bytes, the peer's FIN
// (EPOLLRDHUP), and, always reported, errors and hang-ups; one event, then
// the socket is disarmed until the next EPOLL_CTL_MOD.
const parkEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// epollSet is a Poller's private epoll descriptor. It is non-blocking and
// wrapped in an *os.File, so the Poller's goroutine waits for it to have
// events in the runtime's poller, like for a socket, instead of holding a
// thread in epoll_wait.
type epollSet struct {
	f  *os.File
	rc syscall.RawConn
}

// startLocked makes p's epoll set and starts its goroutine, if p has none.
// It reports whether p has a set. Making it fails when the process is out of
// descriptors (EMFILE), which passes: the direction waits on its goroutine,
// as without a Poller, and the next park tries again.
func (p *Poller) startLocked() bool {
	if p.ep != nil {
		return true
	}
	if p.failed {
		return false
	}
	ep, err := newEpollSet()
	if err != nil {
		p.setErrs++
		return false
	}
	p.ep = ep
	go p.loop(ep)
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
	f := os.NewFile(uintptr(fd), "relay-epoll")
	// Only a file in the runtime's poller takes deadlines: one that is not
	// would make the loop below spin.
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

// arm adds pk's socket to the set, or re-arms it, for one event. Readiness
// is checked at the call, so bytes that came before it are not missed. The
// descriptor is used inside Control only: the net package keeps it open
// meanwhile, and Control fails once the socket is closed.
func (ep *epollSet) arm(pk *parker) error {
	op := unix.EPOLL_CTL_MOD
	if !pk.added {
		op = unix.EPOLL_CTL_ADD
	}
	ev := unix.EpollEvent{Events: parkEvents, Fd: pk.slot, Pad: int32(pk.gen)}
	var cerr error
	err := pk.r.rc.Control(func(fd uintptr) {
		cerr = ep.ctl(op, int(fd), &ev)
	})
	if err != nil {
		return err
	}
	return cerr
}

// remove takes pk's socket out of the set.
func (ep *epollSet) remove(pk *parker) {
	_ = pk.r.rc.Control(func(fd uintptr) {
		// Fails only if the socket was not in the set; closing it
		// would have removed it.
		_ = ep.ctl(unix.EPOLL_CTL_DEL, int(fd), &unix.EpollEvent{})
	})
}

// ctl is epoll_ctl on the set. The set's own descriptor is likewise used
// inside its RawConn's Control, so a concurrent close cannot reuse it.
func (ep *epollSet) ctl(op, fd int, ev *unix.EpollEvent) error {
	var err error
	if cerr := ep.rc.Control(func(epfd uintptr) {
		err = unix.EpollCtl(int(epfd), op, fd, ev)
	}); cerr != nil {
		return cerr
	}
	if err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

func (ep *epollSet) close() { ep.f.Close() }

// loop is the Poller's goroutine: it waits for events on ep and wakes the
// directions they are for. It ends when ep is closed (Close); if the set
// fails otherwise, the parked directions go back to goroutines of their own.
func (p *Poller) loop(ep *epollSet) {
	var evs [128]unix.EpollEvent
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
		if err != nil || werr != nil {
			if !p.closed.Swap(true) {
				p.handBack()
			}
			return
		}
		p.mu.Lock()
		for _, ev := range evs[:n] {
			p.wake(ev.Fd, uint32(ev.Pad))
		}
		p.mu.Unlock()
	}
}
