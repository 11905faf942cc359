package hbone

import (
	"errors"
	"io"
	"time"

	"golang.org/x/net/http2"
)

// readLoop reads and processes frames until the connection fails. It
// returns a connError for protocol violations and the read error otherwise.
func (c *conn) readLoop() error {
	for {
		fh, err := c.rfr.ReadFrameHeader()
		if err != nil {
			return frameReadError(err)
		}
		if !c.sawSettings && fh.Type != http2.FrameSettings {
			// RFC 9113 §3.4: the preface ends with a SETTINGS frame.
			return connError{http2.ErrCodeProtocol, "first frame is not SETTINGS"}
		}
		if err := c.processFrame(fh); err != nil {
			return err
		}
	}
}

// frameReadError maps a Framer read error to a connError where the peer is
// at fault.
func frameReadError(err error) error {
	var ce http2.ConnectionError
	switch {
	case errors.Is(err, http2.ErrFrameTooLarge):
		return connError{http2.ErrCodeFrameSize, "frame too large"}
	case errors.As(err, &ce):
		return connError{http2.ErrCode(ce), "malformed frame"}
	}
	return err
}

func (c *conn) processFrame(fh http2.FrameHeader) error {
	switch fh.Type {
	case http2.FrameData:
		return c.processData(fh)
	case http2.FrameHeaders:
		if int(fh.Length) > c.headerBudget() {
			return connError{http2.ErrCodeEnhanceYourCalm, "header block too large"}
		}
	case http2.FrameSettings, http2.FrameGoAway:
		if fh.Length > maxCtrlFramePayload {
			return connError{http2.ErrCodeFrameSize, "control frame too large"}
		}
	case http2.FramePing:
		if fh.Length != 8 {
			return connError{http2.ErrCodeFrameSize, "bad PING length"}
		}
	case http2.FrameRSTStream, http2.FrameWindowUpdate:
		if fh.Length != 4 {
			return connError{http2.ErrCodeFrameSize, "bad frame length"}
		}
	case http2.FramePriority:
		if fh.Length != 5 {
			return connError{http2.ErrCodeFrameSize, "bad PRIORITY length"}
		}
	case http2.FramePushPromise:
		// Servers never receive PUSH_PROMISE; clients disabled push.
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE"}
	default:
		// Unknown extension frames are ignored (RFC 9113 §5.5), without
		// buffering them.
		_, err := io.CopyN(io.Discard, c.br, int64(fh.Length))
		return err
	}
	f, err := c.rfr.ReadFrameForHeader(fh)
	if err != nil {
		var se http2.StreamError
		if errors.As(err, &se) && fh.Type != http2.FrameHeaders {
			return c.streamError(se.StreamID, se.Code)
		}
		return frameReadError(err)
	}
	switch f := f.(type) {
	case *http2.HeadersFrame:
		return c.processHeaders(f)
	case *http2.SettingsFrame:
		return c.processSettings(f)
	case *http2.PingFrame:
		return c.processPing(f)
	case *http2.GoAwayFrame:
		c.processGoAway(f)
	case *http2.RSTStreamFrame:
		return c.processRST(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	}
	return nil // PRIORITY: ignored (RFC 9113 §5.3.2 deprecates it)
}

// headerBudget bounds the encoded bytes of one header block: twice the
// decoded limit (HPACK rarely inflates) plus room for one frame's overhead.
func (c *conn) headerBudget() int {
	return 2*int(c.cfg.maxHeaderList) + 16<<10
}

// idleStreamLocked reports whether id names a stream that was never opened
// (RFC 9113 §5.1): frames other than HEADERS on it are connection errors.
func (c *conn) idleStreamLocked(id uint32) bool {
	if c.server {
		return id%2 == 0 || id > c.maxPeerID
	}
	return id%2 == 0 || id >= c.nextID
}

// calm is the error for a peer past one of the abuse limits.
func calm(what string) error {
	return connError{http2.ErrCodeEnhanceYourCalm, what}
}

// countLocalReset counts a stream we reset because of the peer.
func (c *conn) countLocalReset() error {
	if c.abuse.localResets.add(time.Now(), maxLocalResets) {
		return calm("too many streams reset for protocol errors")
	}
	return nil
}

// streamError resets stream id with code (RFC 9113 §5.4.2), counting it
// against the peer.
func (c *conn) streamError(id uint32, code http2.ErrCode) error {
	if err := c.countLocalReset(); err != nil {
		return err
	}
	c.mu.Lock()
	s := c.streams[id]
	idle := c.idleStreamLocked(id)
	c.mu.Unlock()
	switch {
	case idle:
		return connError{http2.ErrCodeProtocol, "frame on idle stream"}
	case s != nil:
		s.resetLocal(code)
	case !c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: id, code: code}):
		return calm("control queue full")
	}
	return nil
}

// processData handles a DATA frame. The payload is read straight into pooled
// chunks that the stream then owns, so bytes are copied once on the way from
// the socket to the application.
func (c *conn) processData(fh http2.FrameHeader) error {
	id, length := fh.StreamID, int64(fh.Length)
	if id == 0 {
		return connError{http2.ErrCodeProtocol, "DATA on stream 0"}
	}
	c.mu.Lock()
	if length > c.recvAvail {
		c.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "connection window exceeded"}
	}
	c.recvAvail -= length
	s := c.streams[id]
	idle := c.idleStreamLocked(id)
	c.mu.Unlock()
	if idle {
		return connError{http2.ErrCodeProtocol, "DATA on idle stream"}
	}
	data, pad, err := c.readPadding(fh)
	if err != nil {
		return err
	}
	end := fh.Flags.Has(http2.FlagDataEndStream)
	if data == 0 && !end && c.abuse.emptyFrames.add(time.Now(), maxEmptyFrames) {
		return calm("too many empty frames")
	}
	if code, ok := c.dataAllowed(s, length); !ok {
		if err := c.discard(data+pad, length); err != nil {
			return err
		}
		switch {
		case s == nil && !c.server:
			return nil // as x/net's Transport: what a stream we closed had in flight
		case s == nil:
			return c.closedStreamData(id)
		case code != http2.ErrCodeNo:
			return c.streamError(id, code)
		}
		return nil
	}
	if err := c.readPayload(int(data)); err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, c.br, pad); err != nil {
		return err
	}
	c.deliver(s, length, data, end)
	c.releaseScratch()
	return nil
}

// readPadding consumes the pad length of a padded DATA frame and returns the
// data and padding byte counts.
func (c *conn) readPadding(fh http2.FrameHeader) (data, pad int64, err error) {
	data = int64(fh.Length)
	if !fh.Flags.Has(http2.FlagDataPadded) {
		return data, 0, nil
	}
	if data == 0 {
		return 0, 0, connError{http2.ErrCodeFrameSize, "padded DATA without pad length"}
	}
	b, err := c.br.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	data--
	if pad = int64(b); pad > data {
		return 0, 0, connError{http2.ErrCodeProtocol, "DATA padding too long"}
	}
	return data - pad, pad, nil
}

// dataAllowed reports whether a DATA frame of length bytes may be delivered
// to s (nil: a closed stream); if not, code is the stream error to answer
// with (NO_ERROR: drop it silently, as while our reset of the stream is on
// its way or after the application closed it).
func (c *conn) dataAllowed(s *stream, length int64) (code http2.ErrCode, ok bool) {
	if s == nil {
		return http2.ErrCodeStreamClosed, false // RFC 9113 §6.1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.flags&(fResetSent|fClosed) != 0:
		return http2.ErrCodeNo, false
	case s.flags&(fRemoteEnded|fResetRecv) != 0:
		return http2.ErrCodeStreamClosed, false
	case length > s.inflow:
		return http2.ErrCodeFlowControl, false
	case !c.server && s.flags&fResponded == 0:
		return http2.ErrCodeProtocol, false // DATA before the response
	}
	return 0, true
}

// closedStreamData answers DATA on closed stream id with STREAM_CLOSED
// (RFC 9113 §6.1), as x/net's server does, once per run of frames on the
// same stream (what a peer had in flight when the stream closed arrives
// together), and bounded by maxClosedFrames like every answer a peer can
// make us queue.
func (c *conn) closedStreamData(id uint32) error {
	if id == c.lastClosedData {
		return nil
	}
	c.lastClosedData = id
	if c.abuse.closedData.add(time.Now(), maxClosedFrames) {
		return calm("too many frames on closed streams")
	}
	if !c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: id, code: http2.ErrCodeStreamClosed}) {
		return calm("control queue full")
	}
	return nil
}

// discard skips n payload bytes and returns the frame's connection credit.
func (c *conn) discard(n, length int64) error {
	if _, err := io.CopyN(io.Discard, c.br, n); err != nil {
		return err
	}
	c.mu.Lock()
	c.creditOwed += length
	inc := c.connCreditLocked()
	c.mu.Unlock()
	c.sendConnCredit(inc)
	return nil
}

// smallPayload is the size under which DATA is read into the connection's
// scratch buffer and copied into the stream's last chunk, so that streams of
// small frames do not hold a chunk per frame.
const smallPayload = 4 << 10

// readPayload reads n payload bytes into c.pending (large frames) or
// c.scratch (small ones). The scratch buffer is a pooled chunk taken for
// the frame and given back once it is delivered (releaseScratch), so that
// an idle connection holds none: kept for the connection's life, it was
// 4 KiB per end of every connection that had carried a small frame, about
// 40 bytes per idle tunnel of a pooled connection.
func (c *conn) readPayload(n int) error {
	if n <= smallPayload {
		if c.scratch == nil {
			c.scratch = getChunk(smallPayload)
		}
		_, err := io.ReadFull(c.br, c.scratch[:n])
		return err
	}
	for n > 0 {
		b := getChunk(n)
		k := min(n, len(b))
		if _, err := io.ReadFull(c.br, b[:k]); err != nil {
			putChunk(b)
			c.releasePending()
			return err
		}
		c.pending = append(c.pending, chunk{b: b, w: k})
		n -= k
	}
	return nil
}

// releaseScratch gives the scratch buffer back to its pool once deliver has
// copied what it held.
func (c *conn) releaseScratch() {
	if c.scratch != nil {
		putChunk(c.scratch)
		c.scratch = nil
	}
}

func (c *conn) releasePending() {
	for i := range c.pending {
		putChunk(c.pending[i].b)
		c.pending[i] = chunk{}
	}
	c.pending = c.pending[:0]
}

// deliver appends a DATA frame's payload (read by readPayload) to s and does
// the flow-control accounting: stream and connection credit both wait for
// the application to read the bytes (padding is credited at once), so a
// connection never buffers more than its window (16 MiB by default, as
// ztunnel's h2 releases capacity only as it is consumed, SPEC §2.2),
// however many of its streams have a destination that does not read.
func (c *conn) deliver(s *stream, length, data int64, end bool) {
	s.mu.Lock()
	if s.flags&(fResetSent|fResetRecv|fClosed) != 0 {
		// Reset or closed while we read the payload.
		s.mu.Unlock()
		c.releasePending()
		c.mu.Lock()
		c.creditOwed += length
		inc := c.connCreditLocked()
		c.mu.Unlock()
		c.sendConnCredit(inc)
		return
	}
	if data > 0 && data <= smallPayload {
		s.buf.appendBytes(c.scratch[:data])
	} else if data > 0 {
		s.buf.appendChunks(c.pending)
		clear(c.pending)
		c.pending = c.pending[:0]
	}
	s.inflow -= length
	s.unacked += length - data // padding is credited with the next update
	if end {
		s.flags |= fRemoteEnded
		if s.rerr == nil {
			s.rerr = io.EOF
		}
	}
	s.held += data
	c.mu.Lock()
	c.unread += data
	c.creditOwed += length - data
	inc := c.connCreditLocked()
	c.mu.Unlock()
	s.wakeLocked()
	push := s.pushReadyLocked()
	s.mu.Unlock()
	c.sendConnCredit(inc)
	if push {
		s.pushOut(false)
	}
	if end {
		c.streamUpdate(s)
	}
}

// connCreditLocked takes the owed connection credit when it is worth a
// WINDOW_UPDATE (a quarter of the window) and returns it, or zero.
func (c *conn) connCreditLocked() int64 {
	if c.creditOwed < int64(c.cfg.connWindow)/4 || c.err != nil {
		return 0
	}
	inc := c.creditOwed
	c.creditOwed = 0
	c.recvAvail += inc
	return inc
}

func (c *conn) sendConnCredit(inc int64) {
	if inc > 0 {
		c.queueCtrl(ctrlFrame{kind: ctrlWindowUpdate, val: uint32(inc)})
	}
}

// consumed accounts n bytes the application read or dropped from stream id:
// rel of them had their connection credit withheld, and streamInc is stream
// credit to return.
func (c *conn) consumed(id uint32, n, rel, streamInc int64) {
	c.mu.Lock()
	c.unread -= n
	c.creditOwed += rel
	inc := c.connCreditLocked()
	dead := c.err != nil
	c.mu.Unlock()
	if dead {
		return
	}
	if streamInc > 0 {
		c.queueCtrl(ctrlFrame{kind: ctrlWindowUpdate, stream: id, val: uint32(streamInc)})
	}
	c.sendConnCredit(inc)
}
