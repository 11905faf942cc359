package hbone

import (
	"log/slog"
	"time"
)

// Config holds the HTTP/2 settings and timers of one connection, for either
// role. The zero value uses ztunnel's defaults (SPEC §2.2).
type Config struct {
	// StreamWindow is the largest stream flow-control window we grant. If
	// zero, 4 MiB is used. A stream starts smaller (initStreamWindow) and grows
	// to it as its reader keeps up.
	StreamWindow uint32
	// ConnWindow is the connection flow-control window we advertise. If
	// zero, 16 MiB is used.
	ConnWindow uint32
	// MaxFrameSize is the SETTINGS_MAX_FRAME_SIZE we accept. If zero,
	// 1 MiB is used.
	MaxFrameSize uint32
	// MaxConcurrentStreams is, for a server, the advertised
	// SETTINGS_MAX_CONCURRENT_STREAMS (if zero, 200); for a client, a cap on
	// its own concurrent streams (if zero, 100).
	MaxConcurrentStreams uint32
	// MaxHeaderListSize is the largest decoded header list we accept
	// (SETTINGS_MAX_HEADER_LIST_SIZE). If zero: 64 KiB for a server, 16 KiB
	// for a client.
	MaxHeaderListSize uint32
	// PingInterval is the time between keepalive PINGs; the first is sent
	// one interval after the connection starts. If zero, 10s is used.
	PingInterval time.Duration
	// PingTimeout is how long a PING may stay unacknowledged before the
	// connection is closed. If zero, 20s is used.
	PingTimeout time.Duration
	// IdleTimeout is, for a server, how long a connection may go without
	// any stream before it is sent GOAWAY and closed: a peer that completes
	// TLS and then only answers PINGs must not hold the connection forever
	// (TESTPLAN 22). It is checked at each PING tick, so the close comes
	// up to one PingInterval late. If zero, 10 minutes (twice ztunnel's
	// client pool release, POOL_UNUSED_RELEASE_TIMEOUT, so a well-behaved
	// client closes first); negative turns it off. Clients ignore it.
	IdleTimeout time.Duration
	// Logger receives diagnostics, or nil to discard them.
	Logger *slog.Logger
}

const (
	defaultStreamWindow     = 4 << 20
	defaultConnWindow       = 16 << 20
	defaultMaxFrameSize     = 1 << 20
	defaultServerMaxStreams = 200
	defaultClientMaxStreams = 100
	defaultServerHeaderList = 64 << 10
	defaultClientHeaderList = 16 << 10
	defaultPingInterval     = 10 * time.Second
	defaultPingTimeout      = 20 * time.Second
	defaultIdleTimeout      = 10 * time.Minute

	// initialWindow is the RFC 9113 §6.9.2 initial window of every stream and
	// of the connection before SETTINGS/WINDOW_UPDATE change it.
	initialWindow = 65535
	// maxWindow is the largest legal flow-control window (RFC 9113 §6.9.1).
	maxWindow = 1<<31 - 1
	// minFrameSize is the smallest legal SETTINGS_MAX_FRAME_SIZE and the
	// peer's value until it says otherwise (RFC 9113 §6.5.2).
	minFrameSize      = 1 << 14
	maxFrameSizeLimit = 1<<24 - 1
)

// resolved is a Config with every default applied and values clamped to what
// RFC 9113 allows.
type resolved struct {
	streamWindow  uint32
	initStreamWin uint32 // SETTINGS_INITIAL_WINDOW_SIZE: see initStreamWindow
	connWindow    uint32
	maxFrameSize  uint32
	maxStreams    uint32
	maxHeaderList uint32
	pingInterval  time.Duration
	pingTimeout   time.Duration
	idleTimeout   time.Duration // 0: none
	logger        *slog.Logger
}

func (c Config) resolve(server bool) resolved {
	r := resolved{
		streamWindow:  clampU32(c.StreamWindow, defaultStreamWindow, 1, maxWindow),
		connWindow:    clampU32(c.ConnWindow, defaultConnWindow, initialWindow, maxWindow),
		maxFrameSize:  clampU32(c.MaxFrameSize, defaultMaxFrameSize, minFrameSize, maxFrameSizeLimit),
		maxStreams:    c.MaxConcurrentStreams,
		maxHeaderList: c.MaxHeaderListSize,
		pingInterval:  c.PingInterval,
		pingTimeout:   c.PingTimeout,
		logger:        c.Logger,
	}
	r.initStreamWin = initStreamWindow(r.streamWindow, r.connWindow)
	if r.maxStreams == 0 {
		r.maxStreams = defaultClientMaxStreams
		if server {
			r.maxStreams = defaultServerMaxStreams
		}
	}
	if r.maxHeaderList == 0 {
		r.maxHeaderList = defaultClientHeaderList
		if server {
			r.maxHeaderList = defaultServerHeaderList
		}
	}
	if r.pingInterval <= 0 {
		r.pingInterval = defaultPingInterval
	}
	if r.pingTimeout <= 0 {
		r.pingTimeout = defaultPingTimeout
	}
	if server {
		switch {
		case c.IdleTimeout == 0:
			r.idleTimeout = defaultIdleTimeout
		case c.IdleTimeout > 0:
			r.idleTimeout = c.IdleTimeout
		}
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	return r
}

// clampU32 returns v, or def when v is zero, limited to [lo, hi].
func clampU32(v, def, lo, hi uint32) uint32 {
	if v == 0 {
		v = def
	}
	return min(max(v, lo), hi)
}

// initStreamWindow is the window a stream starts with: a 32nd of the
// connection window (512 KiB by default), at least RFC 9113's 65,535 bytes
// and at most the largest stream window. ztunnel advertises the whole 4 MiB
// at once; then four streams whose destination never reads hold the whole
// 16 MiB connection window and every other stream on the connection stops
// (TESTPLAN L4). Starting small, a stream that never reads pins a 32nd, and
// one whose reader keeps up doubles its window with each credit it returns
// until it reaches the largest (stream.consumedLocked), so one fast stream still gets
// the full 4 MiB after about 1 MiB of data.
func initStreamWindow(streamWin, connWin uint32) uint32 {
	return min(streamWin, max(connWin/32, initialWindow))
}
