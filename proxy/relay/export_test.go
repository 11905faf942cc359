package relay

import "net"

// Internals for the external tests (STYLE testing habit 12).
var (
	BufferSize = bufferSize
	GetBuffer  = getBuffer
	PutBuffer  = putBuffer
	IsBenign   = isBenign
	WriteFull  = writeFull
	ResetAtEOF = resetAtEOF
)

const (
	SmallSize   = smallSize
	MediumSize  = mediumSize
	LargeSize   = largeSize
	MediumAfter = mediumAfter
	LargeAfter  = largeAfter
	SpliceChunk = spliceChunk
)

// NewReadWaiterForTest returns a readability waiter for c, or nil where the
// platform has none.
func NewReadWaiterForTest(c *net.TCPConn) interface{ Wait() error } {
	w := newReadWaiter(c)
	if w == nil {
		return nil
	}
	return waiterForTest{w}
}

type waiterForTest struct{ w *readWaiter }

func (w waiterForTest) Wait() error { return w.w.wait() }

// NewTCPSinkForTest returns the destination a pushing source writes to, for
// the socket c, and a function reporting the bytes it counted.
func NewTCPSinkForTest(c *net.TCPConn) (interface {
	Write(p []byte) (int, error)
	TryWrite(p []byte) (int, error)
}, func() int64) {
	h := &half{p: &pair{}}
	rc, err := c.SyscallConn()
	if err != nil {
		panic(err)
	}
	s := &tcpSink{h: h, tcp: c, rc: rc}
	s.try = s.tryFD
	return s, func() int64 { return h.n }
}

const PushSupported = pushSupported
