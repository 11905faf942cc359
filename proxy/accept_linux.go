package proxy

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// shedQueued resets the connections queued on l, at most shedBatch, with the
// spare descriptor's slot, and reports how many it reset. It gives the
// spare up only once poll has seen a connection queued, and accepts and
// resets in one run of system calls, so that the slot is free for as
// short a time as the kernel allows (see the top of accept.go).
func (g *acceptGuard) shedQueued(l net.Listener) int {
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return 0
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.spare == nil && !g.openSpareLocked() {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		lfd := int(fd)
		if !queued(lfd) {
			return
		}
		g.spare.Close()
		g.spare = nil
		defer g.openSpareLocked()
		for n < shedBatch {
			c, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			if err != nil {
				return // EAGAIN: drained; EMFILE: the slot was taken
			}
			// A reset: the client must not wait on us.
			_ = unix.SetsockoptLinger(c, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			_ = unix.Close(c)
			n++
		}
	})
	return n
}

// queued reports whether a connection waits in the accept queue of the
// listening socket fd, without allocating a descriptor.
func queued(fd int) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
	}
}
