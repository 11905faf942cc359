package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// ClientConn is the client side of one HTTP/2 connection carrying HBONE
// tunnels. It is safe for concurrent use.
type ClientConn struct {
	c *conn
}

// maxStreamID is the largest stream id (RFC 9113 §5.1.1).
const maxStreamID = 1<<31 - 1

// NewClientConn starts HTTP/2 on c: it sends the preface, SETTINGS and the
// connection WINDOW_UPDATE, and waits (bounded by ctx) for the peer's first
// SETTINGS so that streams start with the peer's windows. On failure c is
// closed.
func NewClientConn(ctx context.Context, c net.Conn, cfg Config) (_ *ClientConn, err error) {
	cn := newConn(c, cfg.resolve(false), false)
	cc := &ClientConn{c: cn}
	// The preface and SETTINGS are queued first: they precede everything,
	// including the acknowledgement of the peer's SETTINGS.
	cn.queueCtrl(ctrlFrame{kind: ctrlSettings})
	cn.startBackground()
	cn.bg.Add(1)
	go cc.readLoop()
	defer func() {
		if err != nil {
			cn.fail(err)
			cn.bg.Wait()
		}
	}()
	select {
	case <-cn.settingsCh:
		return cc, nil
	case <-cn.done:
		cn.mu.Lock()
		err = cn.err
		cn.mu.Unlock()
		return nil, fmt.Errorf("hbone: starting HTTP/2: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// readLoop is the client's reader goroutine.
func (cc *ClientConn) readLoop() {
	defer cc.c.bg.Done()
	cc.c.finish(cc.c.readLoop())
}

// Connect opens a tunnel: a CONNECT request with :authority set to authority
// (no :scheme or :path) and the fields of h with lower-cased names. It waits
// for the response: a non-200 answer fails with *StatusError. If ctx ends
// first the stream is reset with CANCEL and ctx's error returned. When the
// connection cannot take another stream Connect fails with ErrNoCapacity;
// streams the peer refused fail with ErrRefused.
func (cc *ClientConn) Connect(ctx context.Context, authority string, h http.Header) (*ClientStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cc.c.reserve(); err != nil {
		return nil, err
	}
	return cc.c.connect(ctx, authority, h, nil)
}

// ConnectEarly is Connect for a tunnel whose first bytes come from src (the
// downstream connection): while it waits for the response it reads src and
// sends what arrives right after the request HEADERS, up to the peer's
// initial stream window (and at most 64 KiB), so that a client that speaks
// first does not wait for the 200 before its bytes move; a server that
// speaks first loses nothing, since the HEADERS leave at once. Nothing is
// read from src after the response: on a 200 the bytes read are all sent
// before ConnectEarly returns, and the caller relays the rest of src.
//
// Bytes sent on a stream answered otherwise are lost with it (the server
// must discard them); a refused stream was not processed, so a Pool sends
// them again on its retry. A stream that took early bytes and was then lost
// with its connection, unanswered, fails with ErrConnClosed rather than
// ErrRefused: the server may have delivered them.
//
// ConnectEarly owns src's read deadline while it runs and leaves it cleared.
// If reading src failed otherwise than with EOF, the returned stream is
// already aborted. EarlyBytes reports how many bytes of src it sent.
func (cc *ClientConn) ConnectEarly(ctx context.Context, authority string, h http.Header, src EarlySource) (*ClientStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cc.c.reserve(); err != nil {
		return nil, err
	}
	e := &early{src: src}
	defer e.release()
	return cc.c.connect(ctx, authority, h, e)
}

// ActiveStreams returns the number of streams open or being opened.
func (cc *ClientConn) ActiveStreams() int {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return cc.c.active
}

// CanTakeNewStream reports whether Connect would get a stream: the
// connection is open, no GOAWAY was sent or received, and fewer streams are
// active than both our cap and the peer's SETTINGS_MAX_CONCURRENT_STREAMS.
func (cc *ClientConn) CanTakeNewStream() bool {
	cc.c.mu.Lock()
	defer cc.c.mu.Unlock()
	return cc.c.canTakeLocked()
}

// Done returns a channel closed when the connection is gone.
func (cc *ClientConn) Done() <-chan struct{} { return cc.c.done }

// Close closes the connection and every stream on it now, and waits for the
// connection's goroutines to exit.
func (cc *ClientConn) Close() error {
	cc.c.fail(ErrConnClosed)
	cc.c.bg.Wait()
	return nil
}

// Shutdown sends GOAWAY, refuses new streams, waits until the open streams
// end (the connection then closes) or ctx is done (it then closes at once
// and returns ctx's error).
func (cc *ClientConn) Shutdown(ctx context.Context) error {
	cc.c.goAway()
	if !cc.c.waitIdle(ctx.Done()) {
		cc.Close()
		return ctx.Err()
	}
	select {
	case <-cc.c.done:
	case <-ctx.Done():
		cc.Close()
		return ctx.Err()
	}
	cc.c.bg.Wait()
	return nil
}

func (c *conn) canTakeLocked() bool {
	return c.err == nil && !c.goAwaySent && !c.goAwayRecv && c.nextID <= maxStreamID &&
		uint32(c.active) < min(c.cfg.maxStreams, c.peerMaxStreams)
}

// reserve takes a concurrency slot for a stream about to be opened.
func (c *conn) reserve() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.canTakeLocked() {
		return ErrNoCapacity
	}
	c.active++
	return nil
}

// unreserve gives back a slot taken by reserve when no stream was opened.
func (c *conn) unreserve() {
	c.mu.Lock()
	c.active--
	idle := c.active == 0 && c.err == nil
	onIdle := c.onIdle
	c.wakeStateLocked()
	c.mu.Unlock()
	if idle && onIdle != nil {
		onIdle()
	}
	c.maybeFinish()
}

// connect opens a stream on a reserved slot and waits for the response,
// sending e's bytes meanwhile if e is not nil.
func (c *conn) connect(ctx context.Context, authority string, h http.Header, e *early) (*ClientStream, error) {
	var room [8]hpack.HeaderField // on the stack, for the usual few fields
	fields := append(room[:0],
		hpack.HeaderField{Name: ":method", Value: http.MethodConnect},
		hpack.HeaderField{Name: ":authority", Value: authority})
	fields, err := appendHeader(fields, h)
	if err != nil || authority == "" {
		c.unreserve()
		return nil, errors.Join(errInvalidHeader, err)
	}
	cs := &ClientStream{}
	s := &cs.stream
	var first []byte
	if e != nil {
		e.tryFirst()
		first = e.buf
	}
	win, sent, err := c.open(s, fields, first)
	if err != nil {
		c.unreserve()
		return nil, err
	}
	if e == nil {
		if err := s.awaitResponse(ctx); err != nil {
			s.Close()
			return nil, unanswered(err, 0)
		}
		return cs, nil
	}
	e.sent = sent
	if e.waits() {
		e.start(s, int(min(win, maxEarly)))
	}
	if err := s.awaitResponse(ctx); err != nil {
		s.Close() // fails the early sender's writes and window waits
		return nil, unanswered(err, e.halt())
	}
	e.halt()
	if err := e.finish(cs); err != nil {
		s.Close()
		return nil, err
	}
	return cs, nil
}

// open assigns s the next stream id and writes its request HEADERS, then,
// in the same write, as much of first as the send windows allow; it returns
// the stream's initial send window (the peer's) and how much of first it
// sent. Ids are assigned under the write lock so that they reach the wire
// in order (RFC 9113 §5.1.1).
func (c *conn) open(s *stream, fields []hpack.HeaderField, first []byte) (win int64, sent int, err error) {
	c.lockWrite()
	c.mu.Lock()
	if c.err != nil || c.goAwayRecv || c.nextID > maxStreamID {
		c.mu.Unlock()
		c.unlockWrite()
		return 0, 0, ErrNoCapacity
	}
	id := c.nextID
	c.nextID += 2
	s.init(c, id)
	win = c.peerInitWin
	n := max(min(int64(len(first)), win, c.sendWin), 0)
	s.sendWin = win - n
	c.sendWin -= n
	c.streams[id] = s
	c.mu.Unlock()
	if c.werr == nil {
		c.werr = c.writeHeadersLocked(id, false, fields)
	}
	if c.werr == nil && n > 0 {
		c.werr = c.writeDataLocked(id, false, first[:n]) // in frames of the peer's size
	}
	if err := c.unlockWrite(); err != nil {
		c.fail(err)
		return 0, 0, ErrNoCapacity // nothing was processed: safe to retry elsewhere
	}
	return win, int(n), nil
}

// unanswered is Connect's error for a stream that got no response, given
// the early bytes it sent. A connection lost first left the request
// unprocessed, safe to retry elsewhere (ErrRefused), unless early bytes went
// out on it: the server may have delivered them, and a retry could deliver
// them twice.
func unanswered(err error, early int) error {
	switch {
	case !errors.Is(err, ErrConnClosed):
		return err
	case early > 0:
		return fmt.Errorf("hbone: connection lost before the response, after early bytes: %w", err)
	default:
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
}

// awaitResponse waits for the final response to the CONNECT; a connection
// lost first fails it with ErrConnClosed (see unanswered).
func (s *stream) awaitResponse(ctx context.Context) error {
	s.mu.Lock()
	for s.flags&fResponded == 0 && s.rerr == nil {
		ch := s.waitChanLocked()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err() // the caller closes the stream: RST_STREAM CANCEL
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.flags&fResponded == 0 {
		var re *ResetError
		switch err := s.rerr; {
		case errors.As(err, &re) && re.Remote && re.Code == http2.ErrCodeRefusedStream:
			return fmt.Errorf("%w: %w", ErrRefused, err)
		case err == io.EOF:
			return errMalformed // reset with NO_ERROR/CANCEL before answering
		default:
			return err
		}
	}
	if s.status != http.StatusOK {
		return &StatusError{Code: s.status}
	}
	return nil
}

// clientHeaders handles a response header block (in c.hblock).
func (c *conn) clientHeaders(id uint32, end bool) error {
	c.mu.Lock()
	s := c.streams[id]
	idle := c.idleStreamLocked(id)
	c.mu.Unlock()
	if idle {
		return connError{http2.ErrCodeProtocol, "HEADERS on a stream we did not open"}
	}
	if s == nil {
		return nil // a stream we already closed; the block was decoded
	}
	h := &c.hblock
	status, ok := parseStatus(h.pseudo.status)
	switch {
	case h.invalid != "" || !ok:
		return c.streamError(id, http2.ErrCodeProtocol)
	case h.truncated:
		s.failResponse(errHeaderTooLarge)
		s.resetLocal(http2.ErrCodeCancel)
		return nil
	}
	s.mu.Lock()
	if s.flags&fResponded != 0 {
		s.mu.Unlock()
		return c.streamError(id, http2.ErrCodeProtocol) // trailers on a tunnel
	}
	if status < 200 {
		s.mu.Unlock()
		if status == http.StatusSwitchingProtocols || end {
			return c.streamError(id, http2.ErrCodeProtocol)
		}
		return nil // interim response
	}
	s.status = status
	s.fields = h.fieldList()
	s.flags |= fResponded
	if end {
		s.flags |= fRemoteEnded
		if s.rerr == nil {
			s.rerr = io.EOF
		}
	}
	s.wakeLocked()
	s.mu.Unlock()
	if end {
		c.streamUpdate(s)
	}
	return nil
}

// failResponse makes awaitResponse fail with err.
func (s *stream) failResponse(err error) {
	s.mu.Lock()
	if s.rerr == nil {
		s.rerr = err
	}
	s.wakeLocked()
	s.mu.Unlock()
}

// ClientStream is one CONNECT tunnel opened by a ClientConn. It implements
// net.Conn; CloseWrite half-closes the tunnel.
type ClientStream struct {
	stream
	early int64 // bytes ConnectEarly sent from its source
}

// EarlyBytes returns how many bytes ConnectEarly read from its source and
// sent on the stream (0 for Connect): the caller's byte count of the
// tunnel's write direction starts there.
func (s *ClientStream) EarlyBytes() int64 { return s.early }

var _ net.Conn = (*ClientStream)(nil)

// ResponseHeader returns the regular fields of the 200 response, with
// canonical keys. Each call builds a new map: the stream keeps the fields in a
// more compact form.
func (s *ClientStream) ResponseHeader() http.Header { return headerOf(s.fields) }
