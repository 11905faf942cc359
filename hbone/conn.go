package hbone

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// conn is one HTTP/2 connection, in either role.
//
// Goroutines and ownership:
//   - The read loop (the ServeConn goroutine, or the client's reader) owns the
//     read side: br, rfr, hdec, hblock, scratch, abuse, lastClosedData,
//     sawSettings. It never blocks on wmu: frames it must send go through
//     the control queue.
//   - The flusher (flushLoop) writes queued control frames and performs
//     graceful closes. Application goroutines write their own DATA and
//     HEADERS under wmu.
//   - Ping timer callbacks and the flusher are counted in bg.
//
// Lock order: stream.wlock → conn.wmu → stream.mu → conn.mu → conn.cmu.
type conn struct {
	nc     net.Conn
	cfg    resolved
	server bool
	log    *slog.Logger

	// Server role: the handler for new streams and the running handlers
	// (runningHandlers and unstarted, below, are guarded by mu).
	handler       Handler
	goAwayAtStart bool // a server connection that arrived after Shutdown
	handlers      sync.WaitGroup

	// Read side, owned by the read loop.
	br      *bufio.Reader
	rfr     *http2.Framer
	hdec    *hpack.Decoder
	hblock  headerBlock
	scratch []byte  // a pooled chunk, held only while a small DATA payload is read and delivered
	pending []chunk // chunks being filled by the read loop
	abuse   abuseCounters
	// lastClosedData is the closed stream we last answered DATA on.
	lastClosedData uint32
	sawSettings    bool

	// Write side. wmu serializes all frame writes; the fields below it are
	// guarded by it.
	wmu    sync.Mutex
	wwait  atomic.Int32 // goroutines waiting for wmu
	bw     connWriter
	wfr    *http2.Framer // writes into bw
	batch  *BatchConn    // under the TLS layer, or nil
	henc   *hpack.Encoder
	hbuf   bytes.Buffer
	werr   error
	hdr    [9]byte
	ctrlWk []ctrlFrame // spare queue swapped with ctrl by the writer

	// cmu guards the control queue.
	cmu  sync.Mutex
	ctrl []ctrlFrame
	kick chan struct{} // cap 1: wakes the flusher

	// peerMaxFrame is the peer's SETTINGS_MAX_FRAME_SIZE; peerTableSize is a
	// pending SETTINGS_HEADER_TABLE_SIZE plus one (0: none), applied to henc
	// under wmu.
	peerMaxFrame  atomic.Uint32
	peerTableSize atomic.Uint32

	// closeAfterFlush asks the flusher to close the connection once it has
	// written everything queued (graceful end after GOAWAY).
	closeAfterFlush atomic.Bool

	// mu guards the connection state below.
	mu              sync.Mutex
	streams         map[uint32]*stream
	active          int             // streams counting toward the concurrency limit
	runningHandlers int             // server: handlers started and not returned
	unstarted       []*ServerStream // server: streams waiting for a handler, in order
	maxPeerID       uint32          // server: highest client stream id seen (ids above it are idle)
	lastProcessedID uint32          // server: highest client stream id not refused, named by our GOAWAY
	nextID          uint32          // client: next stream id to open
	sendWin         int64           // connection send window
	winWake         chan struct{}
	stateWake       chan struct{} // closed when active drops or the conn fails
	peerInitWin     int64
	peerMaxStreams  uint32
	recvAvail       int64 // connection receive window the peer may still use
	creditOwed      int64 // connection credit not yet sent
	unread          int64 // received bytes buffered in accepted streams
	goAwaySent      bool
	goAwayRecv      bool
	goAwayLastID    uint32 // from the peer's GOAWAY
	closing         bool   // a final GOAWAY is being written
	err             error  // set once when the connection fails
	pingOut         bool
	pingSent        time.Time
	pingData        [8]byte
	pingSeq         uint64
	pingTimer       *time.Timer
	lastStream      time.Time // when the connection started or last had no active stream (server idle timeout)
	onIdle          func()    // client: called when active drops to zero
	onDone          func()    // client: called once when the connection fails

	done       chan struct{} // closed when err is set
	settingsCh chan struct{} // closed when the peer's first SETTINGS arrives
	bg         sync.WaitGroup
}

// readBufSize is the size of a connection's read buffer, which frame
// headers and small payloads are read through. A connection keeps it for
// its whole life, idle or not, and a pooled connection carries up to 100
// idle streams, so its size counts per idle tunnel. Bulk DATA is read in
// chunks of 16 and 64 KiB (readPayload), and bufio.Reader.Read reads a
// chunk at least the buffer's size straight from the connection once the
// buffer is empty: only what a frame header's read brought along passes
// through the buffer, so a smaller one copies less per frame, not more.
// Measurements: bench/NOTES.md, "Why readBufSize is what it is".
const readBufSize = 4 << 10

func newConn(nc net.Conn, cfg resolved, server bool) *conn {
	c := &conn{
		nc:             nc,
		cfg:            cfg,
		server:         server,
		log:            cfg.logger,
		br:             bufio.NewReaderSize(nc, readBufSize),
		kick:           make(chan struct{}, 1),
		streams:        make(map[uint32]*stream),
		sendWin:        initialWindow,
		peerInitWin:    initialWindow,
		peerMaxStreams: ^uint32(0),
		recvAvail:      int64(cfg.connWindow),
		done:           make(chan struct{}),
		settingsCh:     make(chan struct{}),
		nextID:         1,
	}
	c.peerMaxFrame.Store(minFrameSize)
	c.bw.w = nc
	c.batch = batchConnOf(nc)
	c.rfr = newFrameReader(c.br, cfg.maxFrameSize)
	c.wfr = http2.NewFramer(&c.bw, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.hblock.init(c)
	c.hdec = hpack.NewDecoder(4096, c.hblock.emit)
	c.hdec.SetMaxStringLength(int(cfg.maxHeaderList))
	c.hblock.dec = c.hdec
	return c
}

// localSettings are the SETTINGS we advertise (SPEC §2.2).
func (c *conn) localSettings() []http2.Setting {
	s := []http2.Setting{
		{ID: http2.SettingInitialWindowSize, Val: c.cfg.initStreamWin},
		{ID: http2.SettingMaxFrameSize, Val: c.cfg.maxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: c.cfg.maxHeaderList},
	}
	if c.server {
		return append(s, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.cfg.maxStreams})
	}
	return append(s, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
}

// startBackground starts the flusher and the keepalive timer.
func (c *conn) startBackground() {
	c.bg.Add(1)
	go c.flushLoop()
	c.mu.Lock()
	c.lastStream = time.Now()
	c.pingTimer = time.AfterFunc(c.cfg.pingInterval, c.pingTick)
	c.mu.Unlock()
}

// enterBG registers a short-lived background callback (a timer) unless the
// connection already failed; the caller must call c.bg.Done.
func (c *conn) enterBG() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.bg.Add(1)
	return true
}

// pingTick sends a keepalive PING every pingInterval and closes the
// connection when one stays unacknowledged for pingTimeout (SPEC §2.2).
func (c *conn) pingTick() {
	if !c.enterBG() {
		return
	}
	defer c.bg.Done()
	now := time.Now()
	c.mu.Lock()
	if c.idleTooLongLocked(now) {
		c.mu.Unlock()
		c.log.Debug("hbone: closing idle connection", "remote", c.nc.RemoteAddr())
		c.goAway()
		c.mu.Lock()
	}
	if c.pingOut {
		if wait := c.pingSent.Add(c.cfg.pingTimeout).Sub(now); wait > 0 {
			c.pingTimer.Reset(wait)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.log.Debug("hbone: ping timeout", "remote", c.nc.RemoteAddr())
		c.closeWithError(http2.ErrCodeNo, errPingTimeout)
		return
	}
	if wait := c.pingSent.Add(c.cfg.pingInterval).Sub(now); !c.pingSent.IsZero() && wait > 0 {
		c.pingTimer.Reset(wait)
		c.mu.Unlock()
		return
	}
	c.pingSeq++
	var data [8]byte
	for i := range data {
		data[i] = byte(c.pingSeq >> (8 * i))
	}
	c.pingOut, c.pingSent, c.pingData = true, now, data
	c.pingTimer.Reset(min(c.cfg.pingInterval, c.cfg.pingTimeout))
	c.mu.Unlock()
	c.queueCtrl(ctrlFrame{kind: ctrlPing, data: data})
}

// idleTooLongLocked reports whether a server connection has had no stream
// for its idle timeout.
func (c *conn) idleTooLongLocked(now time.Time) bool {
	return c.cfg.idleTimeout > 0 && !c.goAwaySent && c.active == 0 && len(c.streams) == 0 &&
		now.Sub(c.lastStream) >= c.cfg.idleTimeout
}

// fail marks the connection dead with err (the first error wins), closes the
// socket and wakes every waiter. It never blocks on wmu and may be called from
// any goroutine holding no locks.
func (c *conn) fail(err error) { c.failConn(err, false) }

// failConn is fail; with linger it first fails the streams and then, before
// closing, drains the socket as drainAfterGoAway describes. Only the read
// loop's goroutine, once it has stopped reading, may ask for linger.
func (c *conn) failConn(err error, linger bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		// Failed already; if it lingers, a later fail (Close, a canceled
		// context) ends the drain now. The socket is read by nothing else.
		_ = c.nc.SetReadDeadline(time.Unix(1, 0))
		return
	}
	c.err = err
	streams := make([]*stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	clear(c.streams)
	if c.winWake != nil {
		close(c.winWake)
		c.winWake = nil
	}
	c.wakeStateLocked()
	if c.pingTimer != nil {
		c.pingTimer.Stop()
	}
	onDone := c.onDone
	close(c.done)
	c.mu.Unlock()

	if !linger {
		c.nc.Close()
	}
	for _, s := range streams {
		s.connFailed()
	}
	if onDone != nil {
		onDone()
	}
	if linger {
		c.drainAfterGoAway()
		c.nc.Close()
	}
}

// closeWithError ends the connection with a final GOAWAY carrying code (RFC
// 9113 §5.4.1), giving the write at most goAwayTimeout, then fails it with
// err. It may block that long; the PING timer uses it, never holding locks.
// The read loop, done reading, instead writes the GOAWAY itself and fails
// with linger (finish).
func (c *conn) closeWithError(code http2.ErrCode, err error) {
	c.writeFinalGoAway(code)
	c.fail(err)
}

// writeFinalGoAway writes the GOAWAY of closeWithError and reports whether it
// went out: false when the connection was closing or failed already, or the
// write failed.
func (c *conn) writeFinalGoAway(code http2.ErrCode) bool {
	c.mu.Lock()
	if c.closing || c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.closing = true
	c.goAwaySent = true
	last := c.lastPeerIDLocked()
	c.mu.Unlock()

	c.nc.SetWriteDeadline(time.Now().Add(goAwayTimeout))
	c.lockWrite()
	if c.werr == nil {
		c.werr = c.wfr.WriteGoAway(last, code, nil)
	}
	return c.unlockWriteFlush() == nil
}

// lastPeerIDLocked is the last-stream-id of a GOAWAY we send: the highest
// peer-initiated stream we processed (RFC 9113 §6.8), which excludes streams
// refused with REFUSED_STREAM: the peer may retry those elsewhere. Clients
// never accept server-initiated streams.
func (c *conn) lastPeerIDLocked() uint32 {
	if c.server {
		return c.lastProcessedID
	}
	return 0
}

// goAway starts a graceful shutdown: a GOAWAY with NO_ERROR naming the last
// stream we processed; streams above it are refused, existing ones finish.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.goAwaySent || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true
	last := c.lastPeerIDLocked()
	c.mu.Unlock()
	c.queueCtrl(ctrlFrame{kind: ctrlGoAway, stream: last, code: http2.ErrCodeNo})
	c.maybeFinish()
}

// maybeFinish closes a connection that was told to go away (either way) once
// no stream is left: the flusher writes what is queued, then closes.
func (c *conn) maybeFinish() {
	c.mu.Lock()
	finish := (c.goAwaySent || c.goAwayRecv) && c.active == 0 && len(c.streams) == 0 && c.err == nil
	c.mu.Unlock()
	if finish {
		c.closeAfterFlush.Store(true)
		c.kickFlusher()
	}
}

func (c *conn) wakeStateLocked() {
	if c.stateWake != nil {
		close(c.stateWake)
		c.stateWake = nil
	}
}

// waitIdle waits until no stream is active or the connection failed. It
// reports whether the connection became idle before done was closed.
func (c *conn) waitIdle(done <-chan struct{}) bool {
	for {
		c.mu.Lock()
		if c.err != nil || (c.active == 0 && len(c.streams) == 0) {
			c.mu.Unlock()
			return true
		}
		if c.stateWake == nil {
			c.stateWake = make(chan struct{})
		}
		ch := c.stateWake
		c.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// newFrameReader returns the Framer the read loop reads frames with.
func newFrameReader(r io.Reader, maxFrameSize uint32) *http2.Framer {
	fr := http2.NewFramer(nil, r)
	fr.SetMaxReadFrameSize(maxFrameSize)
	return fr
}
