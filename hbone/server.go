package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gozt/gozt/internal/workers"
)

// Handler serves one request stream. It is called on a goroutine of its own per
// stream (one that an earlier handler may have run on: internal/workers reuses
// them, so a handler that returns soon starts on a grown stack; one that stays
// for the stream's life keeps that stack), for CONNECT and for any other method
// (the handler answers those, with 400). It must call Respond exactly once;
// after a 200 it may use the stream as a net.Conn, from any goroutine, and must
// eventually Close it. A handler that returns without responding, or panics,
// has its stream reset with INTERNAL_ERROR.
type Handler func(s *ServerStream)

// Server serves HBONE on connections handed to ServeConn. Its exported
// fields must not change after the first ServeConn.
type Server struct {
	// Config holds the connection settings; its zero value is ztunnel's.
	Config Config
	// Handler is called for every request stream. It is required.
	Handler Handler

	mu       sync.Mutex
	conns    map[*conn]struct{}
	serving  sync.WaitGroup // running ServeConn calls
	shutdown bool           // Shutdown or Close was called
	closed   bool           // Close was called
}

// ServeConn serves one HTTP/2 connection until it ends and closes c. It
// returns nil when the connection ended cleanly (the peer closed it, or it was
// drained by Shutdown), ErrServerClosed after Shutdown or Close, and otherwise
// the error that ended it. Canceling ctx closes the connection. ServeConn
// returns only after every handler it started has returned.
//
// After Close, ServeConn closes c at once. After Shutdown it still speaks
// HTTP/2 on c, but only to say GOAWAY: its client was accepted before the
// listener closed (an upgrade's overlap) and may have sent a CONNECT with
// early bytes already. A GOAWAY that processed no stream tells it to retry
// them elsewhere; a connection closed unanswered would not.
func (s *Server) ServeConn(ctx context.Context, c net.Conn) error {
	if s.Handler == nil {
		panic("hbone: Server.Handler is nil")
	}
	cn := newConn(c, s.Config.resolve(true), true)
	cn.handler = s.Handler
	late, ok := s.track(cn)
	if !ok {
		c.Close()
		return ErrServerClosed
	}
	defer s.untrack(cn)
	stop := context.AfterFunc(ctx, func() { cn.fail(ctx.Err()) })
	defer stop()
	if late {
		cn.goAwayAtStart = true
		cn.serve()
		return ErrServerClosed
	}
	return cn.serve()
}

// track registers c; late reports that Shutdown has begun (c is to be told
// to go away), and ok is false after Close.
func (s *Server) track(c *conn) (late, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, false
	}
	if s.conns == nil {
		s.conns = make(map[*conn]struct{})
	}
	s.conns[c] = struct{}{}
	s.serving.Add(1)
	return s.shutdown, true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.serving.Done()
}

// stopAccepting marks the server shut down, so ServeConn only sends new
// connections away, and returns the connections it is serving.
func (s *Server) stopAccepting() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// Shutdown drains the server: every connection gets a GOAWAY naming the last
// stream it processed, new streams are refused, and connections close once
// their streams end. Shutdown waits for that, or until ctx is done, when it
// closes everything still open and returns ctx's error. Later ServeConn
// calls send their connection a GOAWAY and return ErrServerClosed. Shutdown
// may be called more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, c := range s.stopAccepting() {
		c.goAway()
	}
	done := make(chan struct{})
	go func() {
		s.serving.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes every connection now, without GOAWAY. It does not wait for
// ServeConn calls to return.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for _, c := range s.stopAccepting() {
		c.fail(ErrServerClosed)
	}
	return nil
}

// serve runs the server side of the connection.
func (c *conn) serve() error {
	c.queueCtrl(ctrlFrame{kind: ctrlSettings}) // the server preface (RFC 9113 §3.4)
	c.startBackground()
	err := c.readPreface()
	if err == nil {
		if c.goAwayAtStart {
			c.goAway() // names no stream: the client has not been read yet
		}
		err = c.readLoop()
	}
	err = c.finish(err)
	c.bg.Wait()
	c.handlers.Wait()
	return err
}

// readPreface reads the client preface; the first SETTINGS must follow
// within prefaceTimeout too (cleared when it arrives, in the read loop).
func (c *conn) readPreface() error {
	c.nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	var buf [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, buf[:]); err != nil {
		return fmt.Errorf("hbone: reading client preface: %w", err)
	}
	if string(buf[:]) != http2.ClientPreface {
		return connError{http2.ErrCodeProtocol, fmt.Sprintf("bad client preface %q", buf[:])}
	}
	return nil
}

// finish ends the connection after the read loop returned err and returns
// what ServeConn or the client reports.
func (c *conn) finish(err error) error {
	var ce connError
	if errors.As(err, &ce) {
		c.log.Debug("hbone: closing connection", "remote", c.nc.RemoteAddr(), "code", ce.code, "reason", ce.reason)
		if ce.code == http2.ErrCodeEnhanceYourCalm {
			c.log.Warn("hbone: peer exceeded a limit", "remote", c.nc.RemoteAddr(), "reason", ce.reason)
		}
		// The read loop is done, so the socket may linger: the peer that
		// broke a limit is usually still writing.
		c.failConn(err, c.writeFinalGoAway(ce.code))
		return err
	}
	c.fail(err)
	c.mu.Lock()
	final := c.err
	c.mu.Unlock()
	if c.closeAfterFlush.Load() || errors.Is(final, io.EOF) || errors.Is(final, net.ErrClosed) {
		return nil // drained after GOAWAY, or the peer closed
	}
	return final
}

// serverHeaders opens a stream for a request header block (in c.hblock), or
// refuses it.
func (c *conn) serverHeaders(id uint32, end bool) error {
	if id%2 == 0 {
		return connError{http2.ErrCodeProtocol, "client stream id is even"}
	}
	c.mu.Lock()
	if id <= c.maxPeerID {
		s := c.streams[id]
		c.mu.Unlock()
		if s == nil {
			return connError{http2.ErrCodeProtocol, "HEADERS on a closed stream"}
		}
		return c.trailers(s, end)
	}
	c.maxPeerID = id
	draining := c.goAwaySent
	full := c.active >= int(c.cfg.maxStreams)
	if !draining && !full {
		// Decided under mu with goAwaySent, so a GOAWAY names exactly the
		// streams we act on, never a refused one (RFC 9113 §6.8).
		c.lastProcessedID = id
	}
	c.mu.Unlock()
	switch {
	case draining:
		// Above the GOAWAY's last stream id: unprocessed, retry elsewhere.
		return c.refuseStream(id)
	case full:
		// RFC 9113 §5.1.2. Not a protocol error we count: a client may
		// open streams before it has our SETTINGS.
		return c.refuseStream(id)
	case c.hblock.truncated:
		// 431 and a reset, like x/net's server, counted as a local reset.
		if err := c.countLocalReset(); err != nil {
			return err
		}
		c.queueCtrl(ctrlFrame{kind: ctrlStatus, stream: id, val: http.StatusRequestHeaderFieldsTooLarge})
		c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: id, code: http2.ErrCodeNo})
		return nil
	}
	if reason := c.requestProblem(); reason != "" {
		c.log.Debug("hbone: malformed request", "remote", c.nc.RemoteAddr(), "stream", id, "reason", reason)
		return c.streamError(id, http2.ErrCodeProtocol)
	}
	return c.openServerStream(id, end)
}

// trailers handles a second header block on an open stream (RFC 9113
// §8.1), as x/net's server does: ignored when we are resetting the stream;
// STREAM_CLOSED once the client ended or reset it (§5.1); PROTOCOL_ERROR on
// a tunnel, where only DATA may follow (§8.5), or when it is not a trailer
// section (no END_STREAM, or pseudo-headers). Valid trailers end a
// non-CONNECT request's body; their fields are dropped, as every such
// request is answered 400 by the proxy.
func (c *conn) trailers(s *stream, end bool) error {
	h := &c.hblock
	s.mu.Lock()
	f := s.flags
	s.mu.Unlock()
	switch {
	case f&fResetSent != 0:
		return nil
	case f&(fRemoteEnded|fResetRecv) != 0:
		return c.streamError(s.id, http2.ErrCodeStreamClosed)
	case f&fTunnel != 0, !end, h.pseudo.seen != 0, h.invalid != "", h.truncated:
		return c.streamError(s.id, http2.ErrCodeProtocol)
	}
	s.mu.Lock()
	s.flags |= fRemoteEnded
	if s.rerr == nil {
		s.rerr = io.EOF
	}
	s.wakeLocked()
	push := s.pushReadyLocked()
	s.mu.Unlock()
	if push {
		s.pushOut(false)
	}
	c.streamUpdate(s)
	return nil
}

// refuseStream resets stream id with REFUSED_STREAM: we did not process it,
// and the peer may retry it elsewhere (RFC 9113 §8.7). Refusals are counted
// and bounded like every frame a peer can make us queue, so that a peer
// flooding HEADERS at a draining connection, and not reading our answers,
// is cut off rather than growing the control queue.
func (c *conn) refuseStream(id uint32) error {
	if c.abuse.refusals.add(time.Now(), maxRefusals) {
		return calm("too many refused streams")
	}
	if !c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: id, code: http2.ErrCodeRefusedStream}) {
		return calm("control queue full")
	}
	return nil
}

// requestProblem returns why the request in c.hblock is malformed, or "".
func (c *conn) requestProblem() string {
	h := &c.hblock
	if h.invalid != "" {
		return h.invalid
	}
	p := &h.pseudo
	switch {
	case p.seen&seenMethod == 0 || p.method == "":
		return "missing :method"
	case p.seen&seenProtocol != 0:
		return "extended CONNECT is not supported" // we never sent SETTINGS_ENABLE_CONNECT_PROTOCOL
	case p.method != http.MethodConnect && (p.seen&seenScheme == 0 || p.path == ""):
		// RFC 9113 §8.3.1: every other request has :scheme and a non-empty
		// :path. Malformed: reset, not answered (x/net's server does so too).
		return "missing :scheme or :path"
	case p.method != http.MethodConnect:
		return ""
	case p.seen&(seenScheme|seenPath) != 0:
		return "CONNECT with :scheme or :path" // RFC 9113 §8.5
	case p.authority == "":
		return "CONNECT without :authority"
	}
	return ""
}

// openServerStream opens stream id for the request in c.hblock and runs its
// handler, or queues it while MaxConcurrentStreams handlers run.
//
// A stream reset by the client stops counting toward MaxConcurrentStreams at
// once (RFC 9113 §5.1: it is closed), but its handler may run on (dialing an
// upstream). So handlers are bounded on their own, as x/net's server does
// since CVE-2023-44487: a rapid-reset peer queues streams rather than
// starting handlers, and past maxQueuedHandlers queued streams the
// connection ends.
func (c *conn) openServerStream(id uint32, end bool) error {
	h := &c.hblock
	ss := &ServerStream{method: h.pseudo.method, authority: h.pseudo.authority}
	s := &ss.stream
	s.init(c, id)
	if ss.method == http.MethodConnect {
		s.flags |= fTunnel
	}
	s.fields = h.fieldList()
	if end {
		s.flags |= fRemoteEnded
		s.rerr = io.EOF
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil
	}
	if c.runningHandlers >= int(c.cfg.maxStreams) && len(c.unstarted) >= c.maxQueuedHandlers() {
		c.mu.Unlock()
		return calm("too many streams waiting for a handler")
	}
	s.sendWin = c.peerInitWin
	c.streams[id] = s
	c.active++
	start := c.runningHandlers < int(c.cfg.maxStreams)
	if start {
		c.runningHandlers++
		c.handlers.Add(1)
	} else {
		c.unstarted = append(c.unstarted, ss)
	}
	c.mu.Unlock()
	if start {
		workers.Default.Go(func() { c.runHandler(ss) })
	}
	return nil
}

// maxQueuedHandlers bounds the streams waiting for a handler (x/net's
// server allows four times its stream limit).
func (c *conn) maxQueuedHandlers() int { return 4 * int(c.cfg.maxStreams) }

// handlerDone accounts a handler that returned and starts the queued ones
// now allowed to run. Streams closed (reset) while queued are dropped: their
// handlers never run.
func (c *conn) handlerDone() {
	var next []*ServerStream
	c.mu.Lock()
	c.runningHandlers--
	i := 0
	for ; i < len(c.unstarted) && c.runningHandlers < int(c.cfg.maxStreams); i++ {
		ss := c.unstarted[i]
		c.unstarted[i] = nil
		if c.err != nil || c.streams[ss.id] != &ss.stream {
			continue
		}
		c.runningHandlers++
		c.handlers.Add(1)
		next = append(next, ss)
	}
	c.unstarted = c.unstarted[i:]
	if len(c.unstarted) == 0 {
		c.unstarted = nil // do not pin a burst's backing array
	}
	c.mu.Unlock()
	for _, ss := range next {
		workers.Default.Go(func() { c.runHandler(ss) })
	}
}

// runHandler runs the Handler for one stream.
func (c *conn) runHandler(ss *ServerStream) {
	defer c.handlers.Done()
	defer c.handlerDone()
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("hbone: handler panic", "remote", c.nc.RemoteAddr(), "panic", r, "stack", string(debug.Stack()))
			ss.abandon()
			return
		}
		ss.mu.Lock()
		answered := ss.flags&fResponded != 0
		ss.mu.Unlock()
		if !answered {
			ss.abandon()
		}
	}()
	c.handler(ss)
}

// ServerStream is one request on a Server: a CONNECT tunnel once answered
// 200. It implements net.Conn; CloseWrite half-closes the tunnel.
type ServerStream struct {
	stream
	method    string
	authority string
}

var _ net.Conn = (*ServerStream)(nil)

// Method returns the request's :method.
func (s *ServerStream) Method() string { return s.method }

// Authority returns the request's :authority (the tunnel target for
// CONNECT).
func (s *ServerStream) Authority() string { return s.authority }

// Header returns the request's regular header fields with canonical keys.
// Each call builds a new map: the stream keeps the fields in a more compact
// form.
func (s *ServerStream) Header() http.Header { return headerOf(s.fields) }

// Conn returns the connection the stream arrived on: its LocalAddr is the
// address the client dialed, RemoteAddr the peer; a *tls.Conn carries the
// peer's certificates.
func (s *ServerStream) Conn() net.Conn { return s.c.nc }

// Respond answers the request with status and the fields of h (names are
// sent lower-cased; connection-specific fields are dropped). A 200 keeps the
// stream open as a tunnel; any other status ends the stream and releases it.
// Respond must be called exactly once.
func (s *ServerStream) Respond(status int, h http.Header) error {
	if status < 200 || status > 999 {
		return errBadStatus
	}
	var room [4]hpack.HeaderField // on the stack, for the usual few fields
	fields := append(room[:0], statusField(status))
	fields, err := appendHeader(fields, h)
	if err != nil {
		return err
	}
	end := status != http.StatusOK
	s.mu.Lock()
	if s.flags&fResponded != 0 {
		s.mu.Unlock()
		return errRespondTwice
	}
	s.flags |= fResponded
	if end {
		s.flags |= fHandlerDone
	}
	werr := s.writeErrLocked()
	if werr != nil {
		s.flags |= fHandlerDone // the stream is dead: nothing left to release later
	}
	s.mu.Unlock()
	if werr != nil {
		s.c.streamUpdate(&s.stream)
		return werr
	}
	return s.writeResponse(fields, end)
}

// writeResponse writes the response HEADERS; a final non-200 answer also
// ends the stream, resetting it with NO_ERROR if the client is still sending
// (RFC 9113 §8.1), and drops what the client sent.
func (s *ServerStream) writeResponse(fields []hpack.HeaderField, end bool) error {
	c := s.c
	c.lockWrite()
	if c.werr == nil {
		c.werr = c.writeHeadersLocked(s.id, end, fields)
	}
	var st settling
	if end {
		s.mu.Lock()
		s.flags |= fLocalEnded
		sending := s.flags&(fRemoteEnded|fResetRecv|fResetSent) == 0
		if sending {
			s.flags |= fResetSent
		}
		if s.rerr == nil {
			s.rerr = io.EOF
		}
		s.discardLocked()
		s.wakeLocked()
		s.mu.Unlock()
		// Settled before the flush puts the answer on the wire (see
		// settle); the reset follows the HEADERS.
		st = c.settle(&s.stream)
		if sending {
			c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: s.id, code: http2.ErrCodeNo})
		}
	}
	if err := c.unlockWrite(); err != nil {
		c.fail(err)
		return s.writeErr()
	}
	if end {
		runTestHookEnded(s.id)
		c.settled(st)
	}
	return nil
}

// CloseWrite ends the response body with END_STREAM: the client reads EOF
// while it may keep sending.
func (s *ServerStream) CloseWrite() error {
	s.mu.Lock()
	answered := s.flags&fResponded != 0
	s.mu.Unlock()
	if !answered {
		return errNotResponded
	}
	return s.stream.CloseWrite()
}

// Write sends tunnel bytes. It fails before Respond.
func (s *ServerStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	answered := s.flags&fResponded != 0
	s.mu.Unlock()
	if !answered {
		return 0, errNotResponded
	}
	return s.stream.Write(p)
}

// abandon resets a stream its handler gave up on and releases it.
func (s *ServerStream) abandon() {
	s.mu.Lock()
	s.flags |= fHandlerDone | fResponded
	s.mu.Unlock()
	s.resetLocal(http2.ErrCodeInternal)
	s.c.streamUpdate(&s.stream)
}

// ReadFrom sends what it reads from r until EOF. It fails before Respond.
func (s *ServerStream) ReadFrom(r io.Reader) (int64, error) {
	s.mu.Lock()
	answered := s.flags&fResponded != 0
	s.mu.Unlock()
	if !answered {
		return 0, errNotResponded
	}
	return s.stream.ReadFrom(r)
}

// PushTo hands the stream's received bytes to w, to be written as they
// arrive until the read side ends, then calls done (see the stream's PushTo,
// promoted to ClientStream). It fails before Respond.
func (s *ServerStream) PushTo(w io.Writer, done func(error)) error {
	s.mu.Lock()
	answered := s.flags&fResponded != 0
	s.mu.Unlock()
	if !answered {
		return errNotResponded
	}
	return s.stream.PushTo(w, done)
}
