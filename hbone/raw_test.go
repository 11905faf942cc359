package hbone

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// rawPeer is a frame-level HTTP/2 peer built on x/net's Framer, for feeding
// our Server or ClientConn frames a well-behaved implementation would not
// send. A reader goroutine decodes what it receives into rawFrames.
type rawPeer struct {
	t      testing.TB
	c      net.Conn
	fr     *http2.Framer // writes
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	frames chan rawFrame
	done   chan struct{}
}

// rawFrame is a copy of a received frame.
type rawFrame struct {
	typ     http2.FrameType
	flags   http2.Flags
	stream  uint32
	code    http2.ErrCode // RST_STREAM, GOAWAY
	last    uint32        // GOAWAY
	incr    uint32        // WINDOW_UPDATE
	data    []byte        // DATA, PING
	headers []hpack.HeaderField
}

func (f rawFrame) header(name string) string {
	for _, h := range f.headers {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

func newRawPeer(t testing.TB, c net.Conn) *rawPeer {
	r := &rawPeer{t: t, c: c, frames: make(chan rawFrame, 1<<14), done: make(chan struct{})}
	r.fr = http2.NewFramer(c, nil)
	r.fr.AllowIllegalWrites = true
	r.enc = hpack.NewEncoder(&r.hbuf)
	go r.readLoop()
	t.Cleanup(func() {
		c.Close()
		<-r.done
	})
	return r
}

func (r *rawPeer) readLoop() {
	defer close(r.done)
	defer close(r.frames)
	fr := http2.NewFramer(nil, r.c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		rf := rawFrame{typ: f.Header().Type, flags: f.Header().Flags, stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.DataFrame:
			rf.data = append([]byte(nil), f.Data()...)
		case *http2.MetaHeadersFrame:
			rf.typ = http2.FrameHeaders
			rf.headers = append([]hpack.HeaderField(nil), f.Fields...)
		case *http2.RSTStreamFrame:
			rf.code = f.ErrCode
		case *http2.GoAwayFrame:
			rf.code, rf.last = f.ErrCode, f.LastStreamID
		case *http2.WindowUpdateFrame:
			rf.incr = f.Increment
		case *http2.PingFrame:
			rf.data = append([]byte(nil), f.Data[:]...)
		}
		select {
		case r.frames <- rf:
		default: // a flood the test does not inspect; keep reading
		}
	}
}

// handshakeClient sends the client preface and empty SETTINGS and waits for
// the server's SETTINGS, acknowledging it.
func (r *rawPeer) handshakeClient(settings ...http2.Setting) {
	r.t.Helper()
	if _, err := r.c.Write([]byte(http2.ClientPreface)); err != nil {
		r.t.Fatal(err)
	}
	r.must(r.fr.WriteSettings(settings...))
	f := r.want(func(f rawFrame) bool { return f.typ == http2.FrameSettings && !f.flags.Has(http2.FlagSettingsAck) })
	_ = f
	r.must(r.fr.WriteSettingsAck())
}

func (r *rawPeer) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("raw peer write: %v", err)
	}
}

// want reads frames until match accepts one and returns it; it fails on
// timeout or when the connection closes first.
func (r *rawPeer) want(match func(rawFrame) bool) rawFrame {
	r.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-r.frames:
			if !ok {
				r.t.Fatalf("connection closed before the expected frame")
			}
			if match(f) {
				return f
			}
		case <-timeout:
			r.t.Fatalf("timed out waiting for a frame")
		}
	}
}

// wantRST waits for RST_STREAM on stream id and checks its code.
func (r *rawPeer) wantRST(id uint32, code http2.ErrCode) {
	r.t.Helper()
	f := r.want(func(f rawFrame) bool {
		return f.typ == http2.FrameGoAway || f.typ == http2.FrameRSTStream && f.stream == id
	})
	if f.typ != http2.FrameRSTStream || f.code != code {
		r.t.Fatalf("got %v (code %v) on stream %d, want RST_STREAM %v", f.typ, f.code, f.stream, code)
	}
}

// wantGoAway waits for GOAWAY and checks its code, then for the connection
// to close.
func (r *rawPeer) wantGoAway(code http2.ErrCode) rawFrame {
	r.t.Helper()
	f := r.want(func(f rawFrame) bool { return f.typ == http2.FrameGoAway })
	if f.code != code {
		r.t.Fatalf("GOAWAY code %v, want %v", f.code, code)
	}
	return f
}

// wantClosed waits until the connection is closed by the other side.
func (r *rawPeer) wantClosed() {
	r.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-r.frames:
			if !ok {
				return
			}
		case <-timeout:
			r.t.Fatalf("connection not closed")
		}
	}
}

// block encodes fields as a header block.
func (r *rawPeer) block(fields ...string) []byte {
	r.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		r.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), r.hbuf.Bytes()...)
}

// headers writes a HEADERS frame with END_HEADERS carrying fields.
func (r *rawPeer) headers(id uint32, endStream bool, fields ...string) {
	r.t.Helper()
	r.must(r.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: r.block(fields...), EndStream: endStream, EndHeaders: true,
	}))
}

// connect writes a CONNECT request for stream id.
func (r *rawPeer) connect(id uint32, extra ...string) {
	r.t.Helper()
	r.headers(id, false, append([]string{":method", "CONNECT", ":authority", "10.0.0.1:80"}, extra...)...)
}

// serveResult is the outcome of a ServeConn call, waited for at most once.
type serveResult struct {
	ch   chan error
	once sync.Once
	err  error
	ok   bool
}

// wait returns ServeConn's error; ok is false if it did not return in time.
func (s *serveResult) wait(d time.Duration) (err error, ok bool) {
	s.once.Do(func() {
		select {
		case s.err = <-s.ch:
			s.ok = true
		case <-time.After(d):
		}
	})
	return s.err, s.ok
}

// rawServer starts srv on one end of a TCP connection and returns a raw
// client on the other. Cleanup closes the server and waits for ServeConn.
func rawServer(t testing.TB, srv *Server) (*rawPeer, *serveResult) {
	t.Helper()
	cn, sn := connPair(t, false)
	res := &serveResult{ch: make(chan error, 1)}
	go func() { res.ch <- srv.ServeConn(context.Background(), sn) }()
	r := newRawPeer(t, cn)
	t.Cleanup(func() {
		srv.Close()
		if _, ok := res.wait(10 * time.Second); !ok {
			t.Errorf("ServeConn did not return")
		}
	})
	return r, res
}

// rawServerPeer starts a ClientConn against a raw peer playing the server
// (preface read, empty SETTINGS sent).
func rawServerPeer(t testing.TB, cfg Config) (*ClientConn, *rawPeer) {
	t.Helper()
	cn, sn := connPair(t, false)
	return rawServerPeerOver(t, cn, sn, cfg)
}

// rawServerPeerOver starts a ClientConn on cn against a raw peer on sn
// playing the server: it reads the preface and sends settings.
func rawServerPeerOver(t testing.TB, cn, sn net.Conn, cfg Config, settings ...http2.Setting) (*ClientConn, *rawPeer) {
	t.Helper()
	type result struct {
		cc  *ClientConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		cc, err := NewClientConn(context.Background(), cn, cfg)
		ch <- result{cc, err}
	}()
	buf := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(sn, buf); err != nil || string(buf) != http2.ClientPreface {
		t.Fatalf("client preface %q, %v", buf, err)
	}
	r := newRawPeer(t, sn)
	r.must(r.fr.WriteSettings(settings...))
	res := <-ch
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() { res.cc.Close() })
	return res.cc, r
}
