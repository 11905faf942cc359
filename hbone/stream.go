package hbone

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// streamFlags is the state of a stream, guarded by stream.mu.
type streamFlags uint16

const (
	fLocalEnded  streamFlags = 1 << iota // we sent END_STREAM
	fRemoteEnded                         // the peer sent END_STREAM
	fResetSent                           // we sent RST_STREAM
	fResetRecv                           // the peer sent RST_STREAM
	fClosed                              // the application called Close
	fResponded                           // server: Respond called; client: final response received
	fReleased                            // the stream no longer counts toward the concurrency limit
	fRemoved                             // the stream left the connection's map
	fHandlerDone                         // server: the handler answered with a non-200 or gave up
	fTunnel                              // server: the request is a CONNECT (RFC 9113 §8.5)
)

// stream is one HTTP/2 stream carrying a tunnel. It is the common part of
// ServerStream and ClientStream and implements net.Conn with CloseWrite.
//
// Invariants:
//   - buf holds at most the stream window we advertised: the peer may send
//     only that much before we return credit, which happens as the
//     application reads.
//   - Only the read loop appends to buf; only application goroutines read it.
//     After PushTo, the goroutine that owns delivery (pushState.busy) takes
//     from buf instead, and puts back in front what a write did not take.
//   - Writes are serialized by wlock, so the stream's bytes keep their order
//     and only one goroutine spends sendWin.
//   - No goroutine, channel or timer exists for an idle stream: wake is made
//     only while someone waits, dl only when deadlines are set.
type stream struct {
	c  *conn
	id uint32

	wlock sync.Mutex // serializes Write and CloseWrite

	mu      sync.Mutex
	flags   streamFlags
	rerr    error // read error once buf is drained: io.EOF or why not
	werr    error // write error, nil while writes may proceed
	buf     dataBuffer
	inflow  int64 // receive window the peer may still use
	win     int64 // the stream's current window: grows from c.cfg.initStreamWin to c.cfg.streamWindow
	unacked int64 // bytes read but not yet returned as stream credit
	held    int64 // buffered bytes whose connection credit is withheld
	sendWin int64
	wake    chan struct{} // closed on any state change while someone waits
	dl      *deadlines
	fields  []string   // set once: server: request fields; client: response fields (see fieldList)
	status  int        // client: response status
	push    *pushState // set once by PushTo, or nil
	onReset func()     // AfterReset's f until the peer resets the stream, or nil
}

// deadlines holds a stream's read and write deadlines.
type deadlines struct {
	read, write deadline
}

type deadline struct {
	timer   *time.Timer
	gen     uint64
	expired bool
}

func (s *stream) init(c *conn, id uint32) {
	s.c = c
	s.id = id
	s.inflow = int64(c.cfg.initStreamWin)
	s.win = s.inflow
}

// wakeLocked wakes every goroutine waiting on the stream.
func (s *stream) wakeLocked() {
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// waitChanLocked returns a channel closed at the next state change.
func (s *stream) waitChanLocked() <-chan struct{} {
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

// Read reads tunnel bytes. After the peer's END_STREAM (or a reset with
// NO_ERROR or CANCEL) it returns io.EOF once the buffered bytes are read.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	if s.push != nil {
		s.mu.Unlock()
		return 0, errPushing
	}
	for s.buf.Len() == 0 {
		if s.flags&fClosed != 0 {
			s.mu.Unlock()
			return 0, net.ErrClosed
		}
		if s.rerr != nil {
			err := s.rerr
			s.mu.Unlock()
			return 0, err
		}
		if len(p) == 0 {
			s.mu.Unlock()
			return 0, nil
		}
		if s.dl != nil && s.dl.read.expired {
			s.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		ch := s.waitChanLocked()
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	n := s.buf.Read(p)
	s.consumedLocked(n)
	return n, nil
}

// consumedLocked accounts n bytes taken from buf by the application, returns
// stream and connection credit as due, and unlocks s.mu.
func (s *stream) consumedLocked(n int) {
	var streamInc int64
	s.unacked += int64(n)
	if s.flags&(fRemoteEnded|fResetSent|fResetRecv) == 0 && s.unacked >= s.win/4 {
		streamInc, s.unacked = s.unacked, 0
		// The reader kept up with a quarter of the window, so
		// the window doubles (up to the largest), and the growth goes out
		// with the credit.
		grow := min(s.win, int64(s.c.cfg.streamWindow)-s.win)
		s.win += grow
		streamInc += grow
		s.inflow += streamInc
	}
	rel := min(int64(n), s.held)
	s.held -= rel
	s.c.consumed(s.id, int64(n), rel, streamInc)
	s.mu.Unlock()
}

// Write sends p as DATA frames as large as the peer's frame size and the flow
// control windows allow. It blocks while the windows are exhausted.
func (s *stream) Write(p []byte) (int, error) { return s.write(p, nil) }

// write is Write, except that when stop is closed it no longer waits for
// send window: it returns errEarlyHalted with what it sent.
func (s *stream) write(p []byte, stop <-chan struct{}) (int, error) {
	s.wlock.Lock()
	defer s.wlock.Unlock()
	total := len(p)
	for len(p) > 0 {
		n, err := s.reserveSend(len(p), stop)
		if err != nil {
			return total - len(p), err
		}
		c := s.c
		c.lockWrite()
		if s.isReset() {
			// A reset was written (or just queued and written by
			// lockWrite): no DATA may follow it.
			c.unlockWrite()
			return total - len(p), s.writeErr()
		}
		if c.werr == nil {
			c.werr = c.writeDataLocked(s.id, false, p[:n])
		}
		if err := c.unlockWrite(); err != nil {
			c.fail(err)
			return total - len(p), s.writeErr()
		}
		p = p[n:]
	}
	return total, nil
}

// reserveSend waits until both the stream's and the connection's send
// windows are open and takes up to want bytes from them. It gives up with
// errEarlyHalted when stop (nil: never) is closed while it waits.
func (s *stream) reserveSend(want int, stop <-chan struct{}) (int, error) {
	c := s.c
	maxFrame := int64(c.peerMaxFrame.Load())
	for {
		s.mu.Lock()
		if err := s.writeErrLocked(); err != nil {
			s.mu.Unlock()
			return 0, err
		}
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			s.mu.Unlock()
			return 0, ErrConnClosed
		}
		n := min(int64(want), s.sendWin, c.sendWin, maxFrame)
		if n > 0 {
			s.sendWin -= n
			c.sendWin -= n
			c.mu.Unlock()
			s.mu.Unlock()
			return int(n), nil
		}
		if c.winWake == nil {
			c.winWake = make(chan struct{})
		}
		cw := c.winWake
		c.mu.Unlock()
		sw := s.waitChanLocked()
		s.mu.Unlock()
		select {
		case <-cw:
		case <-sw:
		case <-stop:
			return 0, errEarlyHalted
		}
	}
}

// isReset reports whether the stream was reset either way.
func (s *stream) isReset() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flags&(fResetSent|fResetRecv) != 0
}

func (s *stream) writeErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return err
	}
	return ErrConnClosed
}

func (s *stream) writeErrLocked() error {
	switch {
	case s.flags&fClosed != 0:
		return net.ErrClosed
	case s.werr != nil:
		return s.werr
	case s.flags&fLocalEnded != 0:
		return errStreamClosed
	case s.dl != nil && s.dl.write.expired:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// CloseWrite ends the write direction with END_STREAM (the peer reads EOF)
// while reads continue.
func (s *stream) CloseWrite() error {
	s.wlock.Lock()
	defer s.wlock.Unlock()
	s.mu.Lock()
	if err := s.writeErrLocked(); err != nil {
		s.mu.Unlock()
		if err == errStreamClosed {
			return nil
		}
		return err
	}
	s.mu.Unlock()
	return s.endWrite()
}

// testHookEnded, when set (by a test), runs on the goroutine that ended
// stream id, once its END_STREAM is flushed (endWrite, a non-200 answer) or
// its RST_STREAM queued (closeWith).
var testHookEnded atomic.Pointer[func(id uint32)]

func runTestHookEnded(id uint32) {
	if h := testHookEnded.Load(); h != nil {
		(*h)(id)
	}
}

// endWrite sends an empty DATA frame with END_STREAM and records it.
func (s *stream) endWrite() error {
	c := s.c
	c.lockWrite()
	s.mu.Lock()
	reset := s.flags&(fResetSent|fResetRecv) != 0
	s.flags |= fLocalEnded
	s.mu.Unlock()
	if reset {
		c.unlockWrite()
		c.streamUpdate(s)
		return nil
	}
	if c.werr == nil {
		c.werr = c.writeDataLocked(s.id, true, nil)
	}
	st := c.settle(s) // before the flush puts END_STREAM on the wire
	if err := c.unlockWrite(); err != nil {
		c.fail(err)
		return s.writeErr()
	}
	runTestHookEnded(s.id)
	c.settled(st)
	return nil
}

// Close ends the stream. Unless both directions already ended it resets the
// stream with CANCEL, which the peer reads as EOF. Unread bytes are dropped.
func (s *stream) Close() error { return s.closeWith(http2.ErrCodeCancel) }

// Abort ends the stream as Close does, but resets it with CONNECT_ERROR:
// the TCP connection the tunnel carries was reset or closed abnormally
// (RFC 9113 §8.5), which the peer reads as an error, not as EOF, and which
// gozt's relay turns into a TCP reset of its own leg.
func (s *stream) Abort() error { return s.closeWith(http2.ErrCodeConnect) }

func (s *stream) closeWith(code http2.ErrCode) error {
	s.mu.Lock()
	if s.flags&fClosed != 0 {
		s.mu.Unlock()
		return nil
	}
	s.flags |= fClosed
	rst := s.flags&(fResetSent|fResetRecv) == 0 &&
		s.flags&(fLocalEnded|fRemoteEnded) != fLocalEnded|fRemoteEnded
	if rst {
		s.flags |= fResetSent
	}
	s.stopTimersLocked()
	s.wakeLocked()
	s.discardLocked()
	run := s.pushReadyLocked()
	s.mu.Unlock()
	st := s.c.settle(s) // before the RST_STREAM is queued for the flusher
	if rst {
		s.c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: s.id, code: code})
		runTestHookEnded(s.id)
	}
	if run {
		s.pushOut(false)
	}
	s.c.settled(st)
	return nil
}

// discardLocked drops unread bytes and returns their connection credit.
func (s *stream) discardLocked() {
	n := int64(s.buf.reset())
	rel := s.held
	s.held = 0
	if n > 0 || rel > 0 {
		s.c.consumed(s.id, n, rel, 0)
	}
}

// resetLocal resets the stream because the peer broke the protocol on it.
func (s *stream) resetLocal(code http2.ErrCode) {
	s.mu.Lock()
	if s.flags&(fResetSent|fResetRecv) != 0 {
		s.mu.Unlock()
		return
	}
	s.flags |= fResetSent
	err := &ResetError{Code: code}
	if s.rerr == nil || s.rerr == io.EOF {
		s.rerr = err
	}
	if s.werr == nil {
		s.werr = err
	}
	s.wakeLocked()
	run := s.pushReadyLocked()
	s.mu.Unlock()
	st := s.c.settle(s) // before the RST_STREAM is queued for the flusher
	s.c.queueCtrl(ctrlFrame{kind: ctrlRST, stream: s.id, code: code})
	if run {
		s.pushOut(false)
	}
	s.c.settled(st)
}

// resetRemote records the peer's RST_STREAM. NO_ERROR and CANCEL read as EOF
// after the buffered bytes (SPEC §2.2); any reset fails later writes.
func (s *stream) resetRemote(code http2.ErrCode) {
	s.mu.Lock()
	s.flags |= fResetRecv
	err := &ResetError{Code: code, Remote: true}
	if s.rerr == nil {
		if code == http2.ErrCodeNo || code == http2.ErrCodeCancel {
			s.rerr = io.EOF
		} else {
			s.rerr = err
		}
	}
	if s.werr == nil {
		s.werr = err
	}
	s.wakeLocked()
	run := s.pushReadyLocked()
	onReset := s.onReset
	s.onReset = nil
	s.mu.Unlock()
	if run {
		s.pushOut(false)
	}
	s.c.streamUpdate(s)
	if onReset != nil {
		onReset()
	}
}

// AfterReset arranges for f to be called once when the peer resets the
// stream (RST_STREAM with any code), or at once, on the calling goroutine,
// if it already has. A reset with NO_ERROR or CANCEL reads as EOF (SPEC
// §2.2), but nothing written afterwards reaches the peer: a relay uses f to
// stop waiting for bytes to send it. f is not called when the stream ends
// otherwise or the connection fails (reads and writes report those). f runs
// on the connection's reader, after the stream's state is updated, and must
// not block. A later AfterReset replaces f.
func (s *stream) AfterReset(f func()) {
	s.mu.Lock()
	if s.flags&fResetRecv != 0 {
		s.mu.Unlock()
		f()
		return
	}
	s.onReset = f
	s.mu.Unlock()
}

// connFailed records that the connection is gone.
func (s *stream) connFailed() {
	s.mu.Lock()
	if s.rerr == nil {
		s.rerr = ErrConnClosed
	}
	if s.werr == nil {
		s.werr = ErrConnClosed
	}
	s.flags |= fRemoved | fReleased
	s.wakeLocked()
	run := s.pushReadyLocked()
	s.mu.Unlock()
	if run {
		s.pushOut(false)
	}
}

// LocalAddr returns the local address of the underlying connection.
func (s *stream) LocalAddr() net.Addr { return s.c.nc.LocalAddr() }

// RemoteAddr returns the remote address of the underlying connection.
func (s *stream) RemoteAddr() net.Addr { return s.c.nc.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (s *stream) SetDeadline(t time.Time) error {
	s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for Read; a zero t clears it.
func (s *stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setDeadlineLocked(&s.deadlinesLocked().read, t)
	return nil
}

// SetWriteDeadline sets the deadline for Write; a zero t clears it.
func (s *stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setDeadlineLocked(&s.deadlinesLocked().write, t)
	return nil
}

func (s *stream) deadlinesLocked() *deadlines {
	if s.dl == nil {
		s.dl = new(deadlines)
	}
	return s.dl
}

func (s *stream) setDeadlineLocked(d *deadline, t time.Time) {
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.expired = false
	if t.IsZero() || s.flags&fClosed != 0 {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		d.expired = true
		s.wakeLocked()
		return
	}
	gen := d.gen
	d.timer = time.AfterFunc(dur, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if d.gen == gen {
			d.expired = true
			d.timer = nil
			s.wakeLocked()
		}
	})
}

func (s *stream) stopTimersLocked() {
	if s.dl == nil {
		return
	}
	for _, d := range []*deadline{&s.dl.read, &s.dl.write} {
		d.gen++
		if d.timer != nil {
			d.timer.Stop()
			d.timer = nil
		}
	}
}

// refuse fails a client stream the peer's GOAWAY left unprocessed.
func (s *stream) refuse() {
	s.mu.Lock()
	s.flags |= fResetRecv
	if s.rerr == nil {
		s.rerr = ErrRefused
	}
	if s.werr == nil {
		s.werr = ErrRefused
	}
	s.wakeLocked()
	run := s.pushReadyLocked()
	s.mu.Unlock()
	if run {
		s.pushOut(false)
	}
	s.c.streamUpdate(s)
}

// streamUpdate removes s from the connection's map once its protocol state
// is closed, and releases its concurrency slot when it no longer counts: when
// the stream is closed (both directions ended, or reset either way: RFC 9113
// §5.1.2 counts only open and half-closed streams), when the application
// closed it, or, on a server, when the handler answered with a non-200 or
// gave up. The peer and we then agree on the count, so a client within the
// limit is never refused. Handlers that run on after a reset are bounded
// separately (openServerStream).
func (c *conn) streamUpdate(s *stream) { c.settled(c.settle(s)) }

// settling is what settle changed, for settled: whether the stream left
// the map or released its slot, and the idle callback to run if that left
// the connection without streams.
type settling struct {
	changed bool
	onIdle  func()
}

// settle is streamUpdate's bookkeeping; settled runs what it found due. A
// stream that ends itself settles before its ending frame can leave, under
// the write lock or before the RST_STREAM is queued: a client that reads
// the end may open its next stream at once, and the slot must be free by
// then.
func (c *conn) settle(s *stream) settling {
	s.mu.Lock()
	f := s.flags
	both := f&(fLocalEnded|fRemoteEnded) == fLocalEnded|fRemoteEnded
	protoDone := both || f&(fResetSent|fResetRecv) != 0
	remove := protoDone && f&fRemoved == 0
	release := (protoDone || f&(fClosed|fHandlerDone) != 0) && f&fReleased == 0
	if remove {
		s.flags |= fRemoved
	}
	if release {
		s.flags |= fReleased
	}
	s.mu.Unlock()
	if !remove && !release {
		return settling{}
	}
	c.mu.Lock()
	if remove && c.streams[s.id] == s {
		delete(c.streams, s.id)
	}
	if release {
		c.active--
		if c.active == 0 && c.cfg.idleTimeout > 0 {
			c.lastStream = time.Now()
		}
	}
	st := settling{changed: true}
	if release && c.active == 0 && c.err == nil {
		st.onIdle = c.onIdle
	}
	c.wakeStateLocked()
	c.mu.Unlock()
	return st
}

// settled calls the connection's idle callback if the stream left it idle,
// and closes a connection told to go away once no stream is left. The
// caller must hold no lock: the callback may close the connection.
func (c *conn) settled(st settling) {
	if !st.changed {
		return
	}
	if st.onIdle != nil {
		st.onIdle()
	}
	c.maybeFinish()
}

// DropHeader forgets the stream's header fields (a ServerStream's request
// fields, a ClientStream's response fields), which a tunnel would otherwise
// keep for its whole life (issue 16: an idle proxied connection's memory).
// Header and ResponseHeader return an empty map afterwards. Only the
// stream's owner may call it: a server handler, or a client once Connect
// has returned, after it has read what it needs.
func (s *stream) DropHeader() { s.fields = nil }
