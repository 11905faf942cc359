package relay

import (
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pushSupported reports whether sources may push into TCP sockets: TryWrite
// and readability waits need the raw socket calls below.
const pushSupported = true

// tryFD makes one non-blocking write of s.p to the socket. RawConn.Write
// calls it with the socket's write lock held; returning true ends the call
// whatever happened, so it never waits.
func (s *tcpSink) tryFD(fd uintptr) bool {
	for {
		n, err := unix.Write(int(fd), s.p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			n, err = 0, nil
		case err != nil:
			n, err = 0, os.NewSyscallError("write", err)
		}
		s.n, s.serr = max(n, 0), err
		return true
	}
}

// readWaiter waits until a TCP socket has bytes to read (or an end or an
// error to report) without holding a buffer: it parks on the runtime's
// poller through RawConn.Read, and looks with a one-byte MSG_PEEK. The first
// look happens before any wait, so bytes already queued are never missed.
type readWaiter struct {
	rc   syscall.RawConn
	look func(fd uintptr) bool // peek bound once, so a wait allocates nothing
	b    [1]byte
	err  error
}

// newReadWaiter returns a waiter for c, or nil if c has no raw socket.
func newReadWaiter(c *net.TCPConn) *readWaiter {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	w := &readWaiter{rc: rc}
	w.look = w.peek
	return w
}

// wait returns once the socket is readable. An error the look found (a
// reset, say) is returned as it is: the kernel reports a reset only once, so
// the read that follows would otherwise see a plain EOF.
func (w *readWaiter) wait() error {
	w.err = nil
	if err := w.rc.Read(w.look); err != nil {
		return err
	}
	return w.err
}

// peek reports whether the socket is readable: a byte is queued, the peer
// ended its side, or the socket has an error (kept in w.err).
func (w *readWaiter) peek(fd uintptr) bool {
	for {
		// recvfrom(2) directly rather than unix.Recvfrom, whose address
		// buffer escapes: a wait must not allocate.
		_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&w.b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		w.err = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("recvfrom", errno)}
		return true
	}
}
