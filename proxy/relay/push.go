package relay

import (
	"fmt"
	"io"
	"net"
	"syscall"
)

// pushSource is a source that writes its bytes to a destination by itself,
// from goroutines of its own, and reports its end through done: an HBONE
// stream, whose connection reader writes received bytes straight to the
// destination (hbone's stream.PushTo). done is called once, with nil at a
// clean EOF after every byte was written. w is offered TryWrite first.
type pushSource interface {
	PushTo(w io.Writer, done func(error)) error
}

// startPush hands direction h to its source when the source pushes and the
// destination is a TCP socket, so that no goroutine waits on the source while
// it is idle. It reports whether it did; h then ends in pushDone, which
// marks the pair's WaitGroup done.
func (h *half) startPush() bool {
	src, ok := h.src().(pushSource)
	if !ok || !pushSupported {
		return false
	}
	dst, ok := h.dst().(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := dst.SyscallConn()
	if err != nil {
		return false
	}
	h.sink = &tcpSink{h: h, tcp: dst, rc: rc}
	h.sink.try = h.sink.tryFD
	h.p.wg.Add(1)
	if err := src.PushTo(h.sink, h.pushDone); err != nil {
		h.sink = nil
		h.p.wg.Done()
		return false
	}
	return true
}

// pushDone ends a pushed direction: it half-closes the destination after a
// clean EOF, or aborts the pair on a failure, like run does for a read loop.
// The source calls it once, from whichever goroutine saw the end.
func (h *half) pushDone(err error) {
	defer h.p.wg.Done()
	switch {
	case h.sink.werr != nil:
		err = fmt.Errorf("write: %w", h.sink.werr)
	case err != nil:
		err = fmt.Errorf("read: %w", err)
	default:
		err = h.closeWrite()
	}
	if err != nil {
		h.p.fail(h, err)
	}
	h.markEnded()
}

// tcpSink is the destination a pushing source writes to: the TCP socket of
// the other leg. Its methods are called by one goroutine at a time (the
// source guarantees it), and count what they write.
type tcpSink struct {
	h   *half
	tcp *net.TCPConn
	rc  syscall.RawConn

	// TryWrite's system call state: try is tryFD bound once, so that a
	// write allocates nothing.
	try  func(fd uintptr) bool
	p    []byte
	n    int
	serr error

	werr error // the first write error, for the message
}

// Write writes all of p, blocking as needed. The source's short-lived
// drainer calls it for what TryWrite did not take.
func (s *tcpSink) Write(p []byte) (int, error) {
	n, err := writeFull(s.tcp, p)
	s.h.add(int64(n))
	if err != nil && s.werr == nil {
		s.werr = err
	}
	return n, err
}

// TryWrite writes what the socket takes of p now, with one non-blocking
// system call. The connection reader of an HBONE stream calls it, and must
// never block on one destination.
func (s *tcpSink) TryWrite(p []byte) (int, error) {
	s.p, s.n, s.serr = p, 0, nil
	err := s.rc.Write(s.try)
	n := s.n
	s.p = nil
	if err == nil {
		err = s.serr
	}
	s.h.add(int64(n))
	if err != nil && s.werr == nil {
		s.werr = err
	}
	return n, err
}
