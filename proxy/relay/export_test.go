package relay

import (
	"net"
	"sync/atomic"
)

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

// NewSockReaderForTest returns the reader an idle-capable direction reads a
// TCP socket with, or nil where the platform has none. Read waits or not,
// puts the buffer back and returns the bytes read.
func NewSockReaderForTest(c *net.TCPConn) interface {
	Read(wait bool) ([]byte, error)
} {
	r := newSockReader(c)
	if r == nil {
		return nil
	}
	return readerForTest{r}
}

type readerForTest struct{ r *sockReader }

func (r readerForTest) Read(wait bool) ([]byte, error) {
	buf, n, err := r.r.read(SmallSize, wait)
	if buf == nil {
		return nil, err
	}
	got := append([]byte(nil), buf[:n]...)
	putBuffer(buf)
	return got, err
}

// ErrWouldBlock is what a reader's Read without wait returns for an empty
// socket.
var ErrWouldBlock = errWouldBlock

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

// Start is Poller.Start without a Poller: every idle wait stays on a
// goroutine. The tests check the copy's semantics through it
// (helpers_test.go, via).
func Start(a, b net.Conn, aToB, bToA *atomic.Int64, done func(Result, error)) {
	(*Poller)(nil).Start(a, b, aToB, bToA, done)
}

// Copy is CopyWithCounters without live counters.
func Copy(a, b net.Conn) (Result, error) {
	return CopyWithCounters(a, b, nil, nil)
}

// CopyWithCounters is Start's copy run on the calling goroutine: it copies
// bytes both ways between a and b and returns, once both directions have
// ended, what Start would pass to done. The tests check the copy's semantics
// through both (helpers_test.go, via).
func CopyWithCounters(a, b net.Conn, aToB, bToA *atomic.Int64) (Result, error) {
	st := newCopyState(a, b, aToB, bToA)
	st.run()
	return st.result()
}

// run runs both directions and waits for them.
//
// A source that pushes (an HBONE stream towards a TCP socket) needs no
// goroutine of its own: the caller's runs the other direction, and is then
// the only goroutine the connection has. It idles in run, half.run,
// copyBuffered and sockReader.read, which keep small frames (their work is in
// functions marked noinline): the runtime shrinks an idle goroutine's stack
// only while it uses less than a quarter of it.
//
//go:noinline
func (st *copyState) run() {
	st.watchResets()
	if pull := st.startPush(); pull != nil {
		pull.run()
	} else {
		st.pair.wg.Add(1)
		go runHalf(&st.ab)
		st.ba.run()
	}
	st.wait()
}

const IdleRespawn = idleRespawn

// FDOf returns c's descriptor number, for the descriptor reuse test.
func FDOf(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		panic(err)
	}
	fd := -1
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		panic(err)
	}
	return fd
}

// SetBeforeCloseForTest makes f run in p's closes of a socket, just before
// the close itself.
func SetBeforeCloseForTest(p *Poller, f func()) { p.beforeClose = f }

// ParkErrsForTest reports how many times a direction failed to park in p:
// its socket or p's Set was closed, or the Set could not make its epoll
// set.
func ParkErrsForTest(p *Poller) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.parkErrs
}
