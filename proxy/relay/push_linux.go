package relay

import (
	"io"
	"net"
	"os"
	"syscall"

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

// sockReader reads a TCP socket for a direction that holds no buffer while
// it waits: each read takes a pooled buffer (getBuffer) just for its
// non-blocking read(2) and gives it back when the socket has nothing, so a
// wait in the runtime's poller (through RawConn.Read) or in a Poller holds
// none. The first read happens before any wait, so bytes already queued
// are never missed, and a wake-up costs one system call: the read itself,
// where a readiness look (a one-byte MSG_PEEK) and then the read took two,
// and a FIN two reads of nothing.
type sockReader struct {
	rc   syscall.RawConn
	fill func(fd uintptr) bool // readFD bound once, so a read allocates nothing

	// The read in progress, kept small: a parked connection holds this.
	// buf is the buffer read into, cut to the bytes read (its cap is its
	// size class), nil if none came; errno is what the read failed with.
	buf   []byte
	errno syscall.Errno
	size  int32 // the buffer class to take
	wait  bool  // wait in the poller when the socket has nothing
}

// newSockReader returns a reader for c, or nil if c has no raw socket.
func newSockReader(c *net.TCPConn) *sockReader {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	r := &sockReader{rc: rc}
	r.fill = r.readFD
	return r
}

// read reads what the socket holds into a pooled buffer of the given size.
// With wait it first waits until the socket is readable (as long as its
// read deadline allows); without, a socket with nothing to read returns
// errWouldBlock at once. It returns the buffer, whole (the caller puts it
// back with putBuffer), and how many bytes it holds (at least one); or no
// buffer and io.EOF for the peer's FIN, or the error of the read or of the
// wait (a reset, a closed socket, the deadline).
func (r *sockReader) read(size int, wait bool) ([]byte, int, error) {
	r.size, r.wait = int32(size), wait
	err := r.rc.Read(r.fill)
	buf, errno := r.buf, r.errno
	r.buf, r.errno = nil, 0
	switch {
	case err != nil:
		return nil, 0, err
	case buf != nil:
		return buf[:cap(buf)], len(buf), nil
	case errno == unix.EAGAIN:
		return nil, 0, errWouldBlock
	case errno != 0:
		return nil, 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)}
	}
	return nil, 0, io.EOF
}

// readFD makes one non-blocking read into a fresh buffer. RawConn.Read
// calls it with the socket's read lock held, and again each time the
// runtime's poller reports the socket readable, until it returns true.
func (r *sockReader) readFD(fd uintptr) bool {
	buf := getBuffer(int(r.size))
	for {
		n, err := unix.Read(int(fd), buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN && r.wait:
			putBuffer(buf)
			return false
		case err != nil:
			putBuffer(buf)
			r.errno, _ = err.(syscall.Errno)
			if r.errno == 0 {
				r.errno = unix.EIO // unix.Read returns only Errno values
			}
		case n == 0:
			putBuffer(buf) // EOF
		default:
			r.buf = buf[:n]
		}
		return true
	}
}
