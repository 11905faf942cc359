package hbone

import "time"

// Limits against hostile peers (TESTPLAN 1c, bad inputs 7–19). Each abuse
// class is counted per connection in a fixed window; past the limit the
// connection ends with GOAWAY ENHANCE_YOUR_CALM. The limits are far above what
// a well-behaved HBONE peer does (ztunnel sends one PING per 10s, one
// SETTINGS, and resets a stream only when its application gives up).
const (
	abuseWindow = 10 * time.Second

	// maxPeerResets bounds streams the peer resets before the handler
	// answered them (rapid reset, CVE-2023-44487).
	maxPeerResets = 1000
	// maxLocalResets bounds streams we reset because the peer broke the
	// protocol on them (MadeYouReset, CVE-2025-8671).
	maxLocalResets = 200
	// maxRefusals bounds streams we refuse with REFUSED_STREAM, after our
	// GOAWAY or over MAX_CONCURRENT_STREAMS. Refusals are not protocol
	// errors (they do not count toward maxLocalResets): a well-behaved
	// client is refused only for the streams it sent before it saw our
	// GOAWAY or SETTINGS, one flight of them.
	maxRefusals = 1000
	// maxClosedFrames bounds the STREAM_CLOSED resets we answer DATA on
	// closed streams with (RFC 9113 §6.1). Not counted toward
	// maxLocalResets: a well-behaved client's DATA in flight when we
	// answered a stream with a non-200 and reset it lands here, one answer
	// per stream.
	maxClosedFrames = 1000
	// maxSettings bounds SETTINGS frames (CVE-2019-9515).
	maxSettings = 100
	// maxPings bounds PING frames (CVE-2019-9512).
	maxPings = 200
	// maxEmptyFrames bounds DATA frames without payload or END_STREAM and
	// CONTINUATION frames without a fragment (CVE-2019-9518).
	maxEmptyFrames = 200

	// maxQueuedCtrl bounds control frames waiting for the flusher. A peer
	// that provokes answers (PING, SETTINGS, resets) but does not read them
	// fills it.
	maxQueuedCtrl = 4096

	// maxHeaderFrames bounds the frames of one header block (HEADERS plus
	// CONTINUATIONs): a CONTINUATION flood ends the connection here even when
	// its fragments are empty (CVE-2023-45288).
	maxHeaderFrames = 32

	// maxCtrlFramePayload bounds the payload of SETTINGS, GOAWAY and unknown
	// frames we buffer. The fixed-size frames are checked exactly.
	maxCtrlFramePayload = 16 << 10

	// prefaceTimeout bounds the wait for the client preface and the first
	// SETTINGS frame on a new server connection.
	prefaceTimeout = 10 * time.Second

	// goAwayTimeout bounds how long we try to deliver a final GOAWAY before
	// closing the connection anyway.
	goAwayTimeout = time.Second
	// drainBudget bounds the bytes we read and discard after a final GOAWAY
	// (drainAfterGoAway).
	drainBudget = 256 << 10
)

// rateCounter counts events in a fixed window. It is owned by one goroutine.
type rateCounter struct {
	start time.Time
	n     int
}

// add counts one event at now and reports whether more than limit events
// fell into the current window.
func (r *rateCounter) add(now time.Time, limit int) bool {
	if now.Sub(r.start) > abuseWindow {
		r.start, r.n = now, 0
	}
	r.n++
	return r.n > limit
}

// abuseCounters are the per-connection abuse counters, owned by the read
// loop.
type abuseCounters struct {
	peerResets  rateCounter
	localResets rateCounter
	refusals    rateCounter
	closedData  rateCounter
	settings    rateCounter
	pings       rateCounter
	emptyFrames rateCounter
}
