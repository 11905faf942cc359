package hbone

import (
	"crypto/tls"
	"net"
	"sync"
)

// batchBufSize is the write buffer of a BatchConn: four TLS records and their
// overhead.
const batchBufSize = 16 * (16<<10 + 256)

// BatchConn buffers writes below crypto/tls. crypto/tls makes one write
// system call per record (at most 16 KiB); a BatchConn under the *tls.Conn
// that an HBONE connection runs on gathers the records of one batch of frames
// and writes them together when the connection flushes.
//
// Use it by wrapping the TCP connection before the TLS handshake:
//
//	tc := tls.Client(hbone.NewBatchConn(tcpConn), cfg)
//
// Until hbone starts a batch, writes pass straight through (so the handshake
// and anything else written outside hbone behave as usual). NetConn returns
// the wrapped connection for callers that need the *net.TCPConn.
type BatchConn struct {
	net.Conn

	mu       sync.Mutex
	batching bool
	buf      []byte
	err      error
}

// NewBatchConn wraps c.
func NewBatchConn(c net.Conn) *BatchConn { return &BatchConn{Conn: c} }

// NetConn returns the wrapped connection.
func (b *BatchConn) NetConn() net.Conn { return b.Conn }

// Write buffers p while a batch is open and writes it through otherwise.
func (b *BatchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if !b.batching {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > batchBufSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= batchBufSize {
			n, err := b.Conn.Write(p)
			b.err = err
			return n, err
		}
	}
	if b.buf == nil {
		b.buf = batchPool.Get().(*[batchBufSize]byte)[:0]
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

var batchPool = sync.Pool{New: func() any { return new([batchBufSize]byte) }}

func (b *BatchConn) flushLocked() error {
	if len(b.buf) > 0 && b.err == nil {
		_, b.err = b.Conn.Write(b.buf)
	}
	if b.buf != nil {
		batchPool.Put((*[batchBufSize]byte)(b.buf[:batchBufSize]))
		b.buf = nil
	}
	return b.err
}

// begin opens a batch.
func (b *BatchConn) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// end writes the batch and closes it.
func (b *BatchConn) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	return b.flushLocked()
}

// batchConnOf returns the BatchConn under c (directly or under a *tls.Conn
// whose handshake is complete), or nil. Batching under a handshake still in
// progress would hold back its messages while it waits for the answer.
func batchConnOf(c net.Conn) *BatchConn {
	if tc, ok := c.(*tls.Conn); ok {
		if !tc.ConnectionState().HandshakeComplete {
			return nil
		}
		c = tc.NetConn()
	}
	b, _ := c.(*BatchConn)
	return b
}
