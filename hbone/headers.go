package hbone

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerBlock is the decoding state of one header block, reused by the read
// loop for every block of its connection. Validation follows RFC 9113 §8.2
// and §8.3: lower-case names, pseudo-header fields first, each at most once,
// no connection-specific fields. A violation makes the request malformed
// (stream error PROTOCOL_ERROR); a decoded size over the limit truncates it.
// Either way the block is still decoded to the end so that the HPACK state
// stays in step with the peer.
type headerBlock struct {
	c   *conn
	dec *hpack.Decoder

	limit     uint32 // decoded size we accept (SETTINGS_MAX_HEADER_LIST_SIZE)
	size      uint32 // decoded size so far
	truncated bool   // size went over limit; fields is incomplete
	invalid   string // first violation, "" if none

	sawRegular bool
	pseudo     pseudoFields
	fields     []hpack.HeaderField // regular fields, in order
}

// pseudoFields are the pseudo-header fields of a request or response.
type pseudoFields struct {
	method, scheme, authority, path, protocol, status string
	seen                                              uint8 // bit per field
}

const (
	seenMethod uint8 = 1 << iota
	seenScheme
	seenAuthority
	seenPath
	seenProtocol
	seenStatus
)

func (h *headerBlock) init(c *conn) {
	h.c = c
	h.limit = c.cfg.maxHeaderList
}

// reset prepares the block for the next header block.
func (h *headerBlock) reset() {
	clear(h.fields)
	*h = headerBlock{c: h.c, dec: h.dec, limit: h.limit, fields: h.fields[:0]}
	h.dec.SetEmitEnabled(true)
}

// release drops decoded strings so that they are not pinned between blocks.
func (h *headerBlock) release() {
	clear(h.fields)
	h.fields = h.fields[:0]
	if cap(h.fields) > 64 {
		h.fields = nil
	}
	h.pseudo = pseudoFields{}
}

func (h *headerBlock) fail(reason string) {
	if h.invalid == "" {
		h.invalid = reason
	}
	h.dec.SetEmitEnabled(false)
}

// emit is the hpack decoder's callback for each decoded field.
func (h *headerBlock) emit(f hpack.HeaderField) {
	if h.invalid != "" || h.truncated {
		return
	}
	h.size += f.Size()
	if h.size > h.limit {
		h.truncated = true
		h.dec.SetEmitEnabled(false)
		return
	}
	if !httpguts.ValidHeaderFieldValue(f.Value) {
		h.fail("invalid value for " + strconv.Quote(f.Name))
		return
	}
	if strings.HasPrefix(f.Name, ":") {
		if h.sawRegular {
			h.fail("pseudo-header field after regular field")
			return
		}
		h.emitPseudo(f)
		return
	}
	h.sawRegular = true
	if !validWireName(f.Name) {
		h.fail("invalid field name " + strconv.Quote(f.Name))
		return
	}
	if connectionSpecific(f.Name) || (f.Name == "te" && f.Value != "trailers") {
		h.fail("connection-specific field " + strconv.Quote(f.Name))
		return
	}
	h.fields = append(h.fields, f)
}

func (h *headerBlock) emitPseudo(f hpack.HeaderField) {
	var bit uint8
	var dst *string
	p := &h.pseudo
	switch f.Name {
	case ":method":
		bit, dst = seenMethod, &p.method
	case ":scheme":
		bit, dst = seenScheme, &p.scheme
	case ":authority":
		bit, dst = seenAuthority, &p.authority
	case ":path":
		bit, dst = seenPath, &p.path
	case ":protocol":
		bit, dst = seenProtocol, &p.protocol
	case ":status":
		bit, dst = seenStatus, &p.status
	default:
		h.fail("unknown pseudo-header field " + strconv.Quote(f.Name))
		return
	}
	// Requests reach servers and responses reach clients (RFC 9113 §8.3).
	if (bit == seenStatus) == h.c.server {
		h.fail("pseudo-header field " + f.Name + " in the wrong direction")
		return
	}
	if p.seen&bit != 0 {
		h.fail("duplicate pseudo-header field " + f.Name)
		return
	}
	p.seen |= bit
	*dst = f.Value
}

// fieldList returns the regular fields as name, value pairs: the compact
// form a stream keeps for its whole life (an http.Header map costs several
// times as much), or nil when there are none.
func (h *headerBlock) fieldList() []string {
	if len(h.fields) == 0 {
		return nil
	}
	l := make([]string, 0, 2*len(h.fields))
	for _, f := range h.fields {
		l = append(l, f.Name, f.Value)
	}
	return l
}

// headerOf builds an http.Header with canonical keys from name, value pairs
// made by fieldList.
func headerOf(l []string) http.Header {
	hdr := make(http.Header, len(l)/2)
	for i := 0; i+1 < len(l); i += 2 {
		k := canonicalKey(l[i])
		hdr[k] = append(hdr[k], l[i+1])
	}
	return hdr
}

// knownField returns the wire name and the canonical http.Header key of the
// fields Istio's CONNECTs and their responses carry (SPEC §2.3), given
// either, or two empty strings for any other name. The two conversions
// below return these constants instead of making a new string for every
// field of every CONNECT.
func knownField(name string) (wire, key string) {
	switch name {
	case "baggage", "Baggage":
		return "baggage", "Baggage"
	case "forwarded", "Forwarded":
		return "forwarded", "Forwarded"
	case "traceparent", "Traceparent":
		return "traceparent", "Traceparent"
	case "tracestate", "Tracestate":
		return "tracestate", "Tracestate"
	case "x-forwarded-network", "X-Forwarded-Network":
		return "x-forwarded-network", "X-Forwarded-Network"
	}
	return "", ""
}

// canonicalKey is http.CanonicalHeaderKey of a wire name.
func canonicalKey(wire string) string {
	if _, key := knownField(wire); key != "" {
		return key
	}
	return http.CanonicalHeaderKey(wire)
}

// wireName is the lower-case wire name of an http.Header key.
func wireName(key string) string {
	if wire, _ := knownField(key); wire != "" {
		return wire
	}
	return strings.ToLower(key)
}

// validWireName reports whether name is a valid HTTP/2 field name: a
// non-empty token without upper-case letters (RFC 9113 §8.2.1).
func validWireName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if 'A' <= b && b <= 'Z' || !httpguts.IsTokenRune(rune(b)) {
			return false
		}
	}
	return true
}

// connectionSpecific reports whether a (lower-case) field name is
// connection-specific and so forbidden in HTTP/2 (RFC 9113 §8.2.2).
func connectionSpecific(name string) bool {
	switch name {
	case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
		return true
	}
	return false
}

// appendHeader appends h to fields with lower-cased names, skipping
// connection-specific fields. It fails on names or values HTTP/2 cannot carry.
func appendHeader(fields []hpack.HeaderField, h http.Header) ([]hpack.HeaderField, error) {
	for k, vs := range h {
		name := wireName(k)
		if connectionSpecific(name) || name == "te" {
			continue
		}
		if !validWireName(name) {
			return nil, errInvalidHeader
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, errInvalidHeader
			}
			fields = append(fields, hpack.HeaderField{Name: name, Value: v})
		}
	}
	return fields, nil
}

// statusField is a response's :status field; a tunnel's 200 needs no new
// string.
func statusField(status int) hpack.HeaderField {
	v := "200"
	if status != http.StatusOK {
		v = strconv.Itoa(status)
	}
	return hpack.HeaderField{Name: ":status", Value: v}
}

// processHeaders decodes a header block and hands it to the role.
func (c *conn) processHeaders(f *http2.HeadersFrame) error {
	id, end := f.StreamID, f.StreamEnded()
	h := &c.hblock
	h.reset()
	defer h.release()
	if err := c.readHeaderBlock(f); err != nil {
		return err
	}
	if c.server {
		return c.serverHeaders(id, end)
	}
	return c.clientHeaders(id, end)
}

// readHeaderBlock decodes the HEADERS fragment and its CONTINUATION frames
// into c.hblock, bounding the frames and encoded bytes of the block.
//
// A block in several frames is gathered here and decoded at once: fed
// fragment by fragment, the HPACK decoder would keep a field split across
// frames in a buffer of its own that stays as large as that field for the
// connection's life. After a large block the frame reader is replaced for
// the same reason (its read buffer stays as large as the largest frame), so
// an idle connection is back to its usual size (issue 14, defect 6).
func (c *conn) readHeaderBlock(f *http2.HeadersFrame) error {
	frag := f.HeaderBlockFragment()
	used, frames, ended := len(frag), 1, f.HeadersEnded()
	defer func() { c.shrinkReader(used) }() // used as it is at the end
	if ended {
		return c.finishHeaderBlock(frag)
	}
	if len(frag) == 0 && c.abuse.emptyFrames.add(time.Now(), maxEmptyFrames) {
		return calm("too many empty frames")
	}
	block := append([]byte(nil), frag...) // frag is the frame reader's buffer
	for !ended {
		fh, err := c.rfr.ReadFrameHeader() // the Framer insists on a CONTINUATION of this stream
		if err != nil {
			return frameReadError(err)
		}
		frames++
		used += int(fh.Length)
		if frames > maxHeaderFrames || used > c.headerBudget() {
			return calm("header block too large")
		}
		fr, err := c.rfr.ReadFrameForHeader(fh)
		if err != nil {
			return connError{http2.ErrCodeProtocol, "bad CONTINUATION"}
		}
		cf := fr.(*http2.ContinuationFrame)
		ended = cf.HeadersEnded()
		frag := cf.HeaderBlockFragment()
		if len(frag) == 0 && !ended && c.abuse.emptyFrames.add(time.Now(), maxEmptyFrames) {
			return calm("too many empty frames")
		}
		block = append(block, frag...)
	}
	return c.finishHeaderBlock(block)
}

// finishHeaderBlock decodes a whole header block into c.hblock.
func (c *conn) finishHeaderBlock(block []byte) error {
	if _, err := c.hdec.Write(block); err != nil {
		return connError{http2.ErrCodeCompression, fmt.Sprintf("hpack: %v", err)}
	}
	if err := c.hdec.Close(); err != nil {
		return connError{http2.ErrCodeCompression, "truncated header block"}
	}
	return nil
}

// largeHeaderBlock is the encoded size past which a header block's buffers
// are not kept for the next one.
const largeHeaderBlock = 16 << 10

// hpackNoop is a header block that changes no HPACK state: one indexed
// field of the static table (:method GET), decoded with emission off.
var hpackNoop = []byte{0x82}

// shrinkReader replaces the frame reader after a header block of used
// encoded bytes, when that block was large. Between blocks the reader holds
// no state but its buffer and settings. The HPACK decoder keeps a slice of
// the last bytes it was given, so it is handed hpackNoop to let go of the
// large block.
func (c *conn) shrinkReader(used int) {
	if used <= largeHeaderBlock {
		return
	}
	c.rfr = newFrameReader(c.br, c.cfg.maxFrameSize)
	c.hdec.SetEmitEnabled(false) // hblock.reset turns it on for the next block
	// A complete block of one static field cannot fail to decode.
	_, _ = c.hdec.Write(hpackNoop)
	_ = c.hdec.Close()
}
