package hbone

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// writeBufSize is the size of the connection's write buffer. Frames are
// gathered in it and written when no other writer waits, so that a DATA
// frame's header travels with its payload (one TLS record rather than two)
// and control frames ride along.
const writeBufSize = 64 << 10

var writeBufPool = sync.Pool{New: func() any { return new([writeBufSize]byte) }}

// connWriter is a bufio.Writer-like buffer in front of the connection that
// holds a pooled buffer only while it has unflushed bytes.
type connWriter struct {
	w   io.Writer
	buf *[writeBufSize]byte
	n   int
}

func (cw *connWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if cw.buf == nil {
			if len(p) >= writeBufSize {
				// Nothing buffered and a large write: skip the copy.
				_, err := cw.w.Write(p)
				return total, err
			}
			cw.buf = writeBufPool.Get().(*[writeBufSize]byte)
		}
		k := copy(cw.buf[cw.n:], p)
		cw.n += k
		p = p[k:]
		if cw.n == writeBufSize {
			if err := cw.Flush(); err != nil {
				return total - len(p), err
			}
		}
	}
	return total, nil
}

// Flush writes the buffered bytes and returns the buffer to its pool.
func (cw *connWriter) Flush() error {
	if cw.buf == nil {
		return nil
	}
	var err error
	if cw.n > 0 {
		_, err = cw.w.Write(cw.buf[:cw.n])
	}
	writeBufPool.Put(cw.buf)
	cw.buf, cw.n = nil, 0
	return err
}

// ctrlKind is the type of a queued control frame.
type ctrlKind uint8

const (
	ctrlSettings ctrlKind = iota + 1 // our SETTINGS plus the connection WINDOW_UPDATE
	ctrlSettingsAck
	ctrlPing
	ctrlPingAck
	ctrlWindowUpdate
	ctrlRST
	ctrlGoAway
	ctrlStatus // a bare response HEADERS with END_STREAM (server refusing a stream)
)

// ctrlFrame is a frame queued for the flusher by a goroutine that must not
// block on the write lock.
type ctrlFrame struct {
	kind   ctrlKind
	stream uint32
	val    uint32 // WINDOW_UPDATE increment, or status
	code   http2.ErrCode
	data   [8]byte
}

// queueCtrl queues f and wakes the flusher. It reports false when the queue
// is over its bound (the peer provokes frames but does not read them).
func (c *conn) queueCtrl(f ctrlFrame) bool {
	select {
	case <-c.done:
		return true // nobody will write it
	default:
	}
	c.cmu.Lock()
	c.ctrl = append(c.ctrl, f)
	n := len(c.ctrl)
	c.cmu.Unlock()
	c.kickFlusher()
	return n <= maxQueuedCtrl
}

func (c *conn) kickFlusher() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// flushLoop writes queued control frames whenever it is kicked. It is the
// only goroutine that writes on behalf of the read loop, so the read loop keeps
// reading even when the socket is full.
func (c *conn) flushLoop() {
	defer c.bg.Done()
	for {
		select {
		case <-c.kick:
		case <-c.done:
			return
		}
		c.lockWrite()
		err := c.unlockWrite()
		if err != nil {
			c.fail(err)
			return
		}
		if c.closeAfterFlush.Load() {
			c.lockWrite()
			if err := c.unlockWriteFlush(); err != nil {
				c.fail(err)
				return
			}
			c.lingeringClose()
			return
		}
	}
}

// lingeringClose ends a drained connection: it closes our write side and
// lets the read loop consume what the peer still sends until the peer closes
// too, or goAwayTimeout passes. Closing at once could make the kernel reset
// the connection over unread bytes and lose the GOAWAY on the way.
func (c *conn) lingeringClose() {
	cw, ok := c.nc.(closeWriter)
	if !ok {
		c.fail(errShutdown)
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(goAwayTimeout))
	if err := cw.CloseWrite(); err != nil {
		c.fail(errShutdown)
	}
}

type closeWriter interface{ CloseWrite() error }

// drainAfterGoAway gives a final GOAWAY time to arrive once the read loop has
// stopped: it ends our side (TLS close_notify, then FIN) and discards what the
// peer still sends, below TLS, until the peer closes too, goAwayTimeout passes
// or drainBudget bytes were thrown away. Closing over unread bytes at once
// makes the kernel send RST instead of FIN and drop what is still in the send
// queue, the GOAWAY included; the peer that broke a limit, by flooding frames,
// is the one that keeps writing. x/net's server likewise closes only
// goAwayTimeout (1 s) after an error GOAWAY, for this reason (http2/server.go,
// golang.org/issue/18701); the budget stops a peer that never looks at what
// we send from having us read its flood for that long.
func (c *conn) drainAfterGoAway() {
	if cw, ok := c.nc.(closeWriter); ok {
		cw.CloseWrite()
	}
	raw := c.nc
	for {
		u, ok := raw.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		raw = u.NetConn()
	}
	if cw, ok := raw.(closeWriter); ok && raw != c.nc {
		cw.CloseWrite()
	}
	raw.SetReadDeadline(time.Now().Add(goAwayTimeout))
	var buf [4 << 10]byte
	for n := 0; n < drainBudget; {
		m, err := raw.Read(buf[:])
		if err != nil {
			return
		}
		n += m
	}
}

// lockWrite takes the write lock, announcing the wait so that the current
// holder leaves the flush to us, and writes the queued control frames: they
// go first, so the preface and SETTINGS precede everything and window
// updates are not held behind DATA.
func (c *conn) lockWrite() {
	c.wwait.Add(1)
	c.wmu.Lock()
	c.wwait.Add(-1)
	if c.batch != nil {
		c.batch.begin()
	}
	c.writeQueuedLocked()
}

// flushLocked writes out the write buffer (and the batch under TLS).
func (c *conn) flushLocked() {
	if c.werr == nil {
		c.werr = c.bw.Flush()
	}
	if c.batch != nil {
		if err := c.batch.end(); c.werr == nil {
			c.werr = err
		}
	}
}

// unlockWrite flushes the write buffer unless another writer waits (it will
// flush), releases the write lock and returns the write error, if any.
func (c *conn) unlockWrite() error {
	if c.wwait.Load() == 0 {
		c.flushLocked()
	}
	err := c.werr
	c.wmu.Unlock()
	return err
}

// unlockWriteFlush flushes unconditionally and releases the write lock.
func (c *conn) unlockWriteFlush() error {
	c.flushLocked()
	err := c.werr
	c.wmu.Unlock()
	return err
}

// writeQueuedLocked writes every queued control frame.
func (c *conn) writeQueuedLocked() {
	c.cmu.Lock()
	q := c.ctrl
	c.ctrl = c.ctrlWk[:0]
	c.cmu.Unlock()
	for i := range q {
		if c.werr == nil {
			c.werr = c.writeCtrlLocked(&q[i])
		}
		q[i] = ctrlFrame{}
	}
	if cap(q) <= 64 {
		c.ctrlWk = q[:0]
	} else {
		c.ctrlWk = nil // a burst; do not pin its memory
	}
}

func (c *conn) writeCtrlLocked(f *ctrlFrame) error {
	switch f.kind {
	case ctrlSettings:
		if !c.server {
			if _, err := io.WriteString(&c.bw, http2.ClientPreface); err != nil {
				return err
			}
		}
		if err := c.wfr.WriteSettings(c.localSettings()...); err != nil {
			return err
		}
		if inc := c.cfg.connWindow - initialWindow; inc > 0 {
			return c.wfr.WriteWindowUpdate(0, inc)
		}
		return nil
	case ctrlSettingsAck:
		return c.wfr.WriteSettingsAck()
	case ctrlPing:
		return c.wfr.WritePing(false, f.data)
	case ctrlPingAck:
		return c.wfr.WritePing(true, f.data)
	case ctrlWindowUpdate:
		return c.wfr.WriteWindowUpdate(f.stream, f.val)
	case ctrlRST:
		return c.wfr.WriteRSTStream(f.stream, f.code)
	case ctrlGoAway:
		return c.wfr.WriteGoAway(f.stream, f.code, nil)
	case ctrlStatus:
		return c.writeHeadersLocked(f.stream, true, []hpack.HeaderField{statusField(int(f.val))})
	}
	return nil
}

// writeDataLocked writes one DATA frame. The header is written by hand and the
// payload straight into the buffer (Framer.WriteData would copy it once more).
func (c *conn) writeDataLocked(id uint32, endStream bool, p []byte) error {
	// The peer may have lowered its frame size since the caller sized p.
	for maxFrame := int(c.peerMaxFrame.Load()); len(p) > maxFrame; p = p[maxFrame:] {
		if err := c.writeDataLocked(id, false, p[:maxFrame]); err != nil {
			return err
		}
	}
	n := len(p)
	var flags byte
	if endStream {
		flags = byte(http2.FlagDataEndStream)
	}
	c.hdr = [9]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(http2.FrameData), flags,
		byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)}
	if _, err := c.bw.Write(c.hdr[:]); err != nil {
		return err
	}
	_, err := c.bw.Write(p)
	return err
}

// writeHeadersLocked encodes fields and writes them as HEADERS plus as many
// CONTINUATION frames as the peer's frame size requires.
func (c *conn) writeHeadersLocked(id uint32, endStream bool, fields []hpack.HeaderField) error {
	if v := c.peerTableSize.Swap(0); v != 0 {
		c.henc.SetMaxDynamicTableSizeLimit(v - 1)
	}
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.henc.WriteField(f); err != nil {
			return err
		}
	}
	block := c.hbuf.Bytes()
	maxFrame := int(c.peerMaxFrame.Load())
	first := true
	for first || len(block) > 0 {
		frag := block[:min(len(block), maxFrame)]
		block = block[len(frag):]
		var err error
		if first {
			err = c.wfr.WriteHeaders(http2.HeadersFrameParam{
				StreamID:      id,
				BlockFragment: frag,
				EndStream:     endStream,
				EndHeaders:    len(block) == 0,
			})
		} else {
			err = c.wfr.WriteContinuation(id, len(block) == 0, frag)
		}
		if err != nil {
			return err
		}
		first = false
	}
	if c.hbuf.Cap() > 64<<10 {
		c.hbuf = bytes.Buffer{} // do not pin a large header block
	}
	return nil
}
