package proxy

import (
	"errors"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// shedQueued resets the connections queued on l, at most shedBatch, with the
// spare descriptor's slot, and reports how many it reset. It gives the
// spare up only once poll has seen a connection queued, and accepts and
// resets in one run of system calls, so that the slot is free for as
// short a time as the kernel allows (see the top of accept.go). Without
// the spare (lost to another socket) it resets the queue with resetQueue.
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
	n := 0
	_ = rc.Control(func(fd uintptr) {
		lfd := int(fd)
		if !queued(lfd) {
			return
		}
		if g.spare == nil && !g.openSpareLocked() {
			n = resetQueue(lfd)
			return
		}
		g.spare.Close()
		g.spare = nil
		for n < shedBatch {
			c, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			if err != nil {
				break // EAGAIN: drained; EMFILE: the slot was taken
			}
			// A reset: the client must not wait on us.
			_ = unix.SetsockoptLinger(c, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			_ = unix.Close(c)
			n++
		}
		if !g.retakeSpareLocked() && n == 0 {
			n = resetQueue(lfd) // the slot was taken before the first accept
		}
	})
	return n
}

// retakeSpareLocked takes the spare back after a shed gave its slot up,
// and reports whether it is held. The open can fail for a moment without
// the slot being lost: another goroutine's accept4(2) or socket(2) reserves
// a descriptor before it knows whether it fails, so an accept loop whose
// Accept fails (EMFILE, or EAGAIN on an empty queue) holds the freed slot
// for a few microseconds, and while descriptors are gone each listener
// whose loop is in a failure streak fails that way once per acceptBackoff.
// So a failed open is tried again, spareRetries times, spareRetryGap apart,
// before the spare is given up as lost (the next successful Accept takes it
// back then).
func (g *acceptGuard) retakeSpareLocked() bool {
	for try := 0; ; try++ {
		if g.openSpareLocked() {
			return true
		}
		if try == spareRetries {
			return false
		}
		time.Sleep(spareRetryGap)
	}
}

// How often and how far apart retakeSpareLocked tries: at most a few
// milliseconds with the shed's lock held, on a path taken only while the
// process is out of descriptors.
const (
	spareRetries  = 5
	spareRetryGap = 100 * time.Microsecond
)

// resetQueue resets every connection queued on the listening socket lfd
// without a descriptor, for when the spare is gone, and returns how many
// it reset. On Linux, shutdown(SHUT_RD) of a listening TCP socket stops it
// listening and resets what its accept queue holds (inet_shutdown
// disconnects a listener), and listen starts it again on the same socket,
// with its address, options and backlog; a connection that arrives in
// between is refused. A listener bound to port 0 gives its port up when
// it stops, so it is bound again to the address it had (a listener bound
// to a port of its own keeps it, and that bind fails harmlessly).
func resetQueue(lfd int) int {
	sa, err := unix.Getsockname(lfd)
	if err != nil {
		return 0
	}
	n, backlog, ok := acceptQueue(lfd)
	if !ok || unix.Shutdown(lfd, unix.SHUT_RD) != nil {
		return 0
	}
	_ = unix.Bind(lfd, sa)
	if err := unix.Listen(lfd, backlog); err != nil {
		// Not listening any more: every Accept fails, and the
		// accept loop logs it once a second.
		return 0
	}
	return n
}

// acceptQueue returns how many connections wait in the accept queue of the
// listening socket lfd and its backlog, from TCP_INFO (for a listener,
// tcp_get_info reports them as unacked and sacked); ok is false if lfd is
// not a listening TCP socket.
func acceptQueue(lfd int) (n, backlog int, ok bool) {
	info, err := unix.GetsockoptTCPInfo(lfd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || info.State != tcpListen {
		return 0, 0, false
	}
	return int(info.Unacked), int(info.Sacked), true
}

// tcpListen is TCP_LISTEN in TCP_INFO's state (include/net/tcp_states.h).
const tcpListen = 10

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
