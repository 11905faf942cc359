package local

import (
	"bytes"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2peer is a frame-level HTTP/2 client over a TLS connection to a gozt
// 15008, built on x/net's Framer, for sending what a well-behaved HBONE
// client never would (TESTPLAN 5.1 items 1–27). It is hbone's rawPeer
// (hbone/raw_test.go) again, since test helpers do not cross packages.
//
// Only the test goroutine writes (one writer at a time: the Framer is not
// safe for concurrent writes); a reader goroutine decodes what arrives into
// frames, and closes frames when the connection ends.
type h2peer struct {
	t      testing.TB
	c      net.Conn
	fr     *http2.Framer // writes
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	frames chan h2frame
	done   chan struct{}

	mu   sync.Mutex
	recv map[uint32]int // DATA payload bytes received per stream
}

// h2frame is a copy of a received frame.
type h2frame struct {
	typ     http2.FrameType
	flags   http2.Flags
	stream  uint32
	code    http2.ErrCode // RST_STREAM, GOAWAY
	last    uint32        // GOAWAY
	data    []byte        // DATA, PING
	headers []hpack.HeaderField
}

func (f h2frame) header(name string) string {
	for _, h := range f.headers {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

// dialH2Peer opens TCP from src to dst, completes the TLS handshake with cfg
// and starts the frame reader; it does not send the HTTP/2 preface.
func dialH2Peer(t testing.TB, src, dst string, cfg *tls.Config) *h2peer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		raw.Close()
		t.Fatalf("tls handshake with %s: %v", dst, err)
	}
	tc.SetDeadline(time.Time{})
	return newH2Peer(t, tc)
}

func newH2Peer(t testing.TB, c net.Conn) *h2peer {
	p := &h2peer{t: t, c: c, frames: make(chan h2frame, 1<<14), done: make(chan struct{}), recv: map[uint32]int{}}
	p.fr = http2.NewFramer(c, nil)
	p.fr.AllowIllegalWrites = true
	p.enc = hpack.NewEncoder(&p.hbuf)
	go p.readLoop()
	t.Cleanup(p.close)
	return p
}

// close closes the connection and waits for the reader.
func (p *h2peer) close() {
	p.c.Close()
	<-p.done
}

func (p *h2peer) readLoop() {
	defer close(p.done)
	defer close(p.frames)
	fr := http2.NewFramer(nil, p.c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	fr.SetMaxReadFrameSize(1 << 24)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		hf := h2frame{typ: f.Header().Type, flags: f.Header().Flags, stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.DataFrame:
			hf.data = append([]byte(nil), f.Data()...)
			p.mu.Lock()
			p.recv[hf.stream] += len(hf.data)
			p.mu.Unlock()
		case *http2.MetaHeadersFrame:
			hf.typ = http2.FrameHeaders
			hf.headers = append([]hpack.HeaderField(nil), f.Fields...)
		case *http2.RSTStreamFrame:
			hf.code = f.ErrCode
		case *http2.GoAwayFrame:
			hf.code, hf.last = f.ErrCode, f.LastStreamID
		case *http2.PingFrame:
			hf.data = append([]byte(nil), f.Data[:]...)
		}
		select {
		case p.frames <- hf:
		default: // a flood's answers the test does not inspect; keep reading
		}
	}
}

// received returns the DATA payload bytes received so far on stream id,
// whether or not a test read those frames.
func (p *h2peer) received(id uint32) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.recv[id]
}

// handshake sends the client preface and SETTINGS, waits for the server's
// SETTINGS and acknowledges them.
func (p *h2peer) handshake(settings ...http2.Setting) {
	p.t.Helper()
	if _, err := p.c.Write([]byte(http2.ClientPreface)); err != nil {
		p.t.Fatal(err)
	}
	p.must(p.fr.WriteSettings(settings...))
	p.want(func(f h2frame) bool { return f.typ == http2.FrameSettings && !f.flags.Has(http2.FlagSettingsAck) })
	p.must(p.fr.WriteSettingsAck())
}

func (p *h2peer) must(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("h2 peer write: %v", err)
	}
}

// want reads frames until match accepts one and returns it; it fails on
// timeout or when the connection closes first.
func (p *h2peer) want(match func(h2frame) bool) h2frame {
	p.t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				p.t.Fatalf("connection closed before the expected frame")
			}
			if match(f) {
				return f
			}
		case <-timeout:
			p.t.Fatalf("timed out waiting for a frame")
		}
	}
}

// wantRST waits for RST_STREAM on stream id (failing on GOAWAY first) and
// checks its code.
func (p *h2peer) wantRST(id uint32, code http2.ErrCode) {
	p.t.Helper()
	f := p.want(func(f h2frame) bool {
		return f.typ == http2.FrameGoAway || f.typ == http2.FrameRSTStream && f.stream == id
	})
	if f.typ != http2.FrameRSTStream || f.code != code {
		p.t.Fatalf("got %v (code %v) on stream %d, want RST_STREAM %v", f.typ, f.code, f.stream, code)
	}
}

// wantGoAway waits for GOAWAY, checks its code, and then waits for the
// connection to close.
func (p *h2peer) wantGoAway(code http2.ErrCode) h2frame {
	p.t.Helper()
	f := p.want(func(f h2frame) bool { return f.typ == http2.FrameGoAway })
	if f.code != code {
		p.t.Fatalf("GOAWAY code %v, want %v", f.code, code)
	}
	p.wantClosed()
	return f
}

// wantClosed waits until the server closes the connection.
func (p *h2peer) wantClosed() {
	p.t.Helper()
	timeout := time.After(45 * time.Second)
	for {
		select {
		case _, ok := <-p.frames:
			if !ok {
				return
			}
		case <-timeout:
			p.t.Fatalf("connection not closed")
		}
	}
}

// wantStatus waits for the response HEADERS on stream id (failing on a
// reset or GOAWAY first) and checks its :status.
func (p *h2peer) wantStatus(id uint32, status string) h2frame {
	p.t.Helper()
	f := p.want(func(f h2frame) bool {
		return f.typ == http2.FrameGoAway || f.stream == id && (f.typ == http2.FrameHeaders || f.typ == http2.FrameRSTStream)
	})
	if f.typ != http2.FrameHeaders || f.header(":status") != status {
		p.t.Fatalf("got %v (code %v, status %q) on stream %d, want :status %s", f.typ, f.code, f.header(":status"), id, status)
	}
	return f
}

// block encodes name/value pairs as a header block with the connection's
// HPACK encoder (so repeated fields become indexed references).
func (p *h2peer) block(fields ...string) []byte {
	p.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), p.hbuf.Bytes()...)
}

// headers writes one HEADERS frame with END_HEADERS carrying fields.
func (p *h2peer) headers(id uint32, endStream bool, fields ...string) {
	p.t.Helper()
	p.writeBlock(id, endStream, p.block(fields...))
}

// writeBlock writes block as HEADERS and CONTINUATION frames of at most
// 16 KiB, the last with END_HEADERS.
func (p *h2peer) writeBlock(id uint32, endStream bool, block []byte) {
	p.t.Helper()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), 16<<10)
		frag := block[:n]
		block = block[n:]
		if first {
			p.must(p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0}))
			first = false
		} else {
			p.must(p.fr.WriteContinuation(id, len(block) == 0, frag))
		}
	}
}

// connect writes a CONNECT request for stream id to authority.
func (p *h2peer) connect(id uint32, authority string, extra ...string) {
	p.t.Helper()
	p.headers(id, false, append([]string{":method", "CONNECT", ":authority", authority}, extra...)...)
}

// echo sends msg on an open tunnel, reads it back and returns window to the
// server for it.
func (p *h2peer) echo(id uint32, msg []byte) {
	p.t.Helper()
	p.must(p.fr.WriteData(id, false, msg))
	var got []byte
	for len(got) < len(msg) {
		f := p.want(func(f h2frame) bool {
			return f.typ == http2.FrameGoAway || f.stream == id && (f.typ == http2.FrameData || f.typ == http2.FrameRSTStream)
		})
		if f.typ != http2.FrameData {
			p.t.Fatalf("got %v (code %v) on stream %d, want DATA", f.typ, f.code, id)
		}
		got = append(got, f.data...)
		if len(f.data) > 0 {
			p.must(p.fr.WriteWindowUpdate(0, uint32(len(f.data))))
			p.must(p.fr.WriteWindowUpdate(id, uint32(len(f.data))))
		}
	}
	if !bytes.Equal(got, msg) {
		p.t.Fatalf("echo on stream %d: %d bytes differ from the %d sent", id, len(got), len(msg))
	}
}
