package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// TestNonConnectReachesHandler: other methods are passed to the Handler,
// which answers 400.
func TestNonConnectReachesHandler(t *testing.T) {
	methods := make(chan string, 1)
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		methods <- s.Method()
		s.Respond(http.StatusBadRequest, nil)
	}})
	r.Handshake()
	r.Headers(1, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", "x")
	f := r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	if got := f.Header(":status"); got != "400" || !f.Flags.Has(http2.FlagHeadersEndStream) {
		t.Errorf("response :status %q end_stream %v, want 400 with END_STREAM", got, f.Flags.Has(http2.FlagHeadersEndStream))
	}
	if got := <-methods; got != "GET" {
		t.Errorf("handler saw method %q", got)
	}
}

// TestMalformedRequests: each malformed request is reset with
// PROTOCOL_ERROR and never reaches the handler (RFC 9113 §8.2, §8.3, §8.5).
func TestMalformedRequests(t *testing.T) {
	tests := []struct {
		name   string
		fields []string
	}{
		{"connect with path", []string{":method", "CONNECT", ":authority", "a:1", ":path", "/"}},
		{"connect with scheme", []string{":method", "CONNECT", ":authority", "a:1", ":scheme", "https"}},
		{"extended connect", []string{":method", "CONNECT", ":protocol", "websocket", ":scheme", "https", ":path", "/", ":authority", "a:1"}},
		{"connect without authority", []string{":method", "CONNECT"}},
		{"no method", []string{":authority", "a:1"}},
		{"uppercase name", []string{":method", "CONNECT", ":authority", "a:1", "X-Upper", "v"}},
		{"duplicate pseudo", []string{":method", "CONNECT", ":method", "CONNECT", ":authority", "a:1"}},
		{"pseudo after regular", []string{":method", "CONNECT", "x", "y", ":authority", "a:1"}},
		{"unknown pseudo", []string{":method", "CONNECT", ":authority", "a:1", ":foo", "x"}},
		{"response pseudo", []string{":method", "CONNECT", ":authority", "a:1", ":status", "200"}},
		{"connection header", []string{":method", "CONNECT", ":authority", "a:1", "connection", "close"}},
		{"transfer-encoding", []string{":method", "CONNECT", ":authority", "a:1", "transfer-encoding", "chunked"}},
		{"te not trailers", []string{":method", "CONNECT", ":authority", "a:1", "te", "gzip"}},
		{"newline in value", []string{":method", "CONNECT", ":authority", "a:1", "x", "a\nb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var called atomic.Bool
			r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
				called.Store(true)
				s.Respond(http.StatusOK, nil)
				s.Close()
			}})
			r.Handshake()
			r.Headers(1, false, tt.fields...)
			r.WantRST(1, http2.ErrCodeProtocol)
			// The connection survives: a good request still works.
			r.Connect(3, rawTarget)
			f := r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 3 })
			if f.Header(":status") != "200" {
				t.Errorf("follow-up request: status %q", f.Header(":status"))
			}
			if !called.Load() {
				t.Errorf("handler not called for the valid request")
			}
		})
	}
}

// TestMaxConcurrentStreams: streams beyond the advertised limit are refused
// with REFUSED_STREAM; the first ones are unaffected.
func TestMaxConcurrentStreams(t *testing.T) {
	const limit = 5
	release := make(chan struct{})
	r, _ := rawServer(t, &Server{Config: Config{MaxConcurrentStreams: limit}, Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		s.Close()
	}})
	defer close(release)
	r.Handshake()
	for i := range limit {
		id := uint32(2*i + 1)
		r.Connect(id, rawTarget)
		r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == id })
	}
	r.Connect(2*limit+1, rawTarget)
	r.WantRST(2*limit+1, http2.ErrCodeRefusedStream)
	r.Connect(2*limit+3, rawTarget)
	r.WantRST(2*limit+3, http2.ErrCodeRefusedStream)
	// The first streams still carry data.
	r.Must(r.Framer.WriteData(1, false, []byte("ping")))
	r.Must(r.Framer.WritePing(false, [8]byte{1}))
	f := r.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FramePing || f.Type == http2.FrameRSTStream || f.Type == http2.FrameGoAway
	})
	if f.Type != http2.FramePing {
		t.Fatalf("got %v after refusals", f.Type)
	}
}

// TestHeaderListTooLarge: a request whose decoded header list exceeds the
// limit is answered 431 and reset; the handler never runs.
func TestHeaderListTooLarge(t *testing.T) {
	var called atomic.Bool
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		called.Store(true)
		s.Respond(http.StatusOK, nil)
		s.Close()
	}})
	r.Handshake()
	fields := []string{":method", "CONNECT", ":authority", "a:1"}
	value := strings.Repeat("v", 1000)
	for i := range 80 { // ~80 KiB decoded, over the 64 KiB default
		fields = append(fields, "x-h"+itoa(i), value)
	}
	block := r.Block(fields...)
	// Send it in 16 KiB pieces, like a peer respecting the default frame size.
	r.WriteBlock(1, false, block)
	f := r.Want(func(f hbonetest.Frame) bool {
		return f.Stream == 1 && (f.Type == http2.FrameHeaders || f.Type == http2.FrameRSTStream) || f.Type == http2.FrameGoAway
	})
	if f.Type != http2.FrameHeaders || f.Header(":status") != "431" {
		t.Fatalf("got %v %q, want HEADERS :status 431", f.Type, f.Header(":status"))
	}
	r.WantRST(1, http2.ErrCodeNo)
	if called.Load() {
		t.Errorf("handler ran for an oversized request")
	}
}

// TestContinuationFlood: a header block that never ends is cut off at the
// budget and the connection closed (CVE-2023-45288), for empty and
// non-empty fragments.
func TestContinuationFlood(t *testing.T) {
	for _, fragSize := range []int{0, 1000} {
		t.Run("fragment "+itoa(fragSize), func(t *testing.T) {
			r, res := rawServer(t, &Server{Handler: func(s *ServerStream) { s.Close() }})
			r.Handshake()
			r.Must(r.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.Block(":method", "CONNECT")}))
			frag := bytes.Repeat([]byte{0x40}, fragSize) // fragments of literal-field prefixes
			wrote := 0
			for i := 0; i < 100000; i++ {
				if err := r.Framer.WriteContinuation(1, false, frag); err != nil {
					break
				}
				wrote++
			}
			r.WantShutdown(http2.ErrCodeEnhanceYourCalm)
			if err, ok := res.wait(10 * time.Second); !ok || err == nil {
				t.Errorf("ServeConn = %v (returned %v), want an error", err, ok)
			}
			if wrote >= 100000 {
				t.Errorf("server accepted %d CONTINUATION frames", wrote)
			}
		})
	}
}

// TestRapidReset: streams opened and reset at once. Handlers never run more
// than MaxConcurrentStreams at a time, and the connection ends with GOAWAY
// ENHANCE_YOUR_CALM (CVE-2023-44487).
func TestRapidReset(t *testing.T) {
	const limit = 10
	var running, peak atomic.Int32
	r, _ := rawServer(t, &Server{Config: Config{MaxConcurrentStreams: limit}, Handler: func(s *ServerStream) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // an upstream dial
		s.Respond(http.StatusOK, nil)
		s.Close()
		running.Add(-1)
	}})
	r.Handshake()
	go func() {
		for id := uint32(1); id < 20000; id += 2 {
			if err := r.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.Block(":method", "CONNECT", ":authority", "a:1"), EndHeaders: true}); err != nil {
				return
			}
			if err := r.Framer.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
				return
			}
		}
	}()
	r.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	if p := peak.Load(); p > limit {
		t.Errorf("%d handlers ran at once, limit %d", p, limit)
	}
}

// TestMadeYouReset: streams the server must reset because of the client's
// frames (WINDOW_UPDATE with increment 0) are counted; past the limit the
// connection ends (CVE-2025-8671).
func TestMadeYouReset(t *testing.T) {
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(io.Discard, s)
		s.Close()
	}})
	r.Handshake()
	go func() {
		for id := uint32(1); id < 4000; id += 2 {
			if err := r.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.Block(":method", "CONNECT", ":authority", "a:1"), EndHeaders: true}); err != nil {
				return
			}
			if err := r.Framer.WriteWindowUpdate(id, 0); err != nil {
				return
			}
		}
	}()
	r.WantRST(1, http2.ErrCodeProtocol)
	r.WantShutdown(http2.ErrCodeEnhanceYourCalm)
}

// TestFloods: SETTINGS, PING and empty-DATA floods end the connection with
// ENHANCE_YOUR_CALM.
func TestFloods(t *testing.T) {
	tests := []struct {
		name string
		send func(r *hbonetest.Peer) error
	}{
		{"settings", func(r *hbonetest.Peer) error { return r.Framer.WriteSettings() }},
		{"ping", func(r *hbonetest.Peer) error { return r.Framer.WritePing(false, [8]byte{}) }},
		{"empty data", func(r *hbonetest.Peer) error { return r.Framer.WriteData(1, false, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
				s.Respond(http.StatusOK, nil)
				io.Copy(io.Discard, s)
				s.Close()
			}})
			r.Handshake()
			r.Connect(1, rawTarget)
			go func() {
				for range 100000 {
					if tt.send(r) != nil {
						return
					}
				}
			}()
			r.WantShutdown(http2.ErrCodeEnhanceYourCalm)
		})
	}
}

// TestGoAwayReachesFloodingPeer: a peer that breaks a limit while it still
// writes, and reads nothing until it is done writing, gets the GOAWAY and then
// an orderly close. The peer's tiny receive buffer keeps the server's answers
// (and the GOAWAY behind them) in the server's send queue; a server that
// closes over the unread flood makes the kernel reset the connection and drop
// that queue. The peer reads only after ServeConn returned, so the test does
// not depend on which side is quicker.
func TestGoAwayReachesFloodingPeer(t *testing.T) {
	// The buffer is set before connecting, so the window the peer
	// advertises is small from the first segment on.
	cn, sn := tcpPairVia(t, "127.0.0.1", &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1)
		})
		return errors.Join(err, serr)
	}})
	srv := &Server{Handler: func(s *ServerStream) { s.Respond(http.StatusOK, nil); s.Close() }}
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), sn) }()
	defer srv.Close()

	var flood bytes.Buffer
	flood.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&flood, nil)
	fr.WriteSettings()
	for range 20 * maxPings {
		fr.WritePing(false, [8]byte{})
	}
	if _, err := cn.Write(flood.Bytes()); err != nil {
		t.Errorf("writing the flood: %v (the server stopped reading it)", err)
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return")
	}

	cn.SetReadDeadline(time.Now().Add(10 * time.Second))
	rd := http2.NewFramer(nil, cn)
	pings := 0
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			t.Fatalf("after %d PING acks: %v, before any GOAWAY", pings, err)
		}
		if _, ok := f.(*http2.PingFrame); ok {
			pings++
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", g.ErrCode)
			}
			break
		}
	}
	if _, err := rd.ReadFrame(); err != io.EOF {
		t.Fatalf("after the GOAWAY: %v, want EOF", err)
	}
}

// TestWindowUpdateOverflow: a WINDOW_UPDATE pushing a window past 2^31-1 is a
// stream error on a stream and a connection error on the connection (RFC
// 9113 §6.9.1).
func TestWindowUpdateOverflow(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
			s.Respond(http.StatusOK, nil)
			io.Copy(io.Discard, s)
			s.Close()
		}})
		r.Handshake()
		r.Connect(1, rawTarget)
		r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
		r.Must(r.Framer.WriteWindowUpdate(1, maxWindow))
		r.WantRST(1, http2.ErrCodeFlowControl)
	})
	t.Run("connection", func(t *testing.T) {
		r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) { s.Close() }})
		r.Handshake()
		r.Must(r.Framer.WriteWindowUpdate(0, maxWindow))
		r.WantShutdown(http2.ErrCodeFlowControl)
	})
}

// TestStreamWindowExceeded: DATA beyond the stream window we advertised is
// a stream FLOW_CONTROL_ERROR.
func TestStreamWindowExceeded(t *testing.T) {
	r, _ := rawServer(t, &Server{Config: Config{StreamWindow: 1 << 14, MaxFrameSize: 1 << 15}, Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		time.Sleep(100 * time.Millisecond) // not reading
		s.Close()
	}})
	r.Handshake()
	r.Connect(1, rawTarget)
	r.Must(r.Framer.WriteData(1, false, make([]byte, 1<<14+1)))
	r.WantRST(1, http2.ErrCodeFlowControl)
}

// TestEarlyDataHeldForHandler: DATA sent right after the CONNECT HEADERS sits
// in the stream until the handler reads it; after a refusal (non-200) it is
// dropped, never delivered (TESTPLAN S27).
func TestEarlyDataHeldForHandler(t *testing.T) {
	for _, accept := range []bool{true, false} {
		name := "refused"
		if accept {
			name = "accepted"
		}
		t.Run(name, func(t *testing.T) {
			early := []byte("GET /admin HTTP/1.1\r\n\r\n")
			arrived := make(chan struct{})
			result := make(chan string, 1)
			r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
				<-arrived
				// Wait until the bytes are buffered in the stream.
				for {
					s.mu.Lock()
					n := s.buf.Len()
					s.mu.Unlock()
					if n == len(early) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				if !accept {
					s.Respond(http.StatusUnauthorized, nil)
					n, err := s.Read(make([]byte, 100))
					result <- "read " + itoa(n) + " " + errString(err)
					return
				}
				s.Respond(http.StatusOK, nil)
				defer s.Close()
				b := make([]byte, 100)
				n, _ := io.ReadAtLeast(s, b, len(early))
				result <- string(b[:n])
			}})
			r.Handshake()
			r.Connect(1, rawTarget)
			r.Must(r.Framer.WriteData(1, false, early))
			close(arrived)
			f := r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
			got := <-result
			if accept {
				if f.Header(":status") != "200" || got != string(early) {
					t.Errorf("status %q, handler read %q; want 200 and the early bytes", f.Header(":status"), got)
				}
				return
			}
			if f.Header(":status") != "401" || got != "read 0 EOF" {
				t.Errorf("status %q, handler %q; want 401 and no bytes", f.Header(":status"), got)
			}
			r.WantRST(1, http2.ErrCodeNo)
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestPingTimeoutServer: a client that never acknowledges PINGs loses its
// connection after PingTimeout.
func TestPingTimeoutServer(t *testing.T) {
	r, res := rawServer(t, &Server{
		Config:  Config{PingInterval: 20 * time.Millisecond, PingTimeout: 50 * time.Millisecond},
		Handler: func(s *ServerStream) { s.Close() },
	})
	start := time.Now()
	r.Handshake()
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FramePing && !f.Flags.Has(http2.FlagPingAck) })
	r.WantClosed()
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("closed after %v, before the ping timeout", d)
	}
	if err, ok := res.wait(5 * time.Second); !ok || err == nil {
		t.Errorf("ServeConn = %v, %v; want a ping timeout error", err, ok)
	}
}

// TestPingAckedKeepsConnection: a peer that acknowledges PINGs keeps its
// connection across many intervals.
func TestPingAckedKeepsConnection(t *testing.T) {
	p := newPair(t, echoHandler, pairOpts{
		srv: Config{PingInterval: 10 * time.Millisecond, PingTimeout: time.Second},
		cli: Config{PingInterval: 10 * time.Millisecond, PingTimeout: time.Second},
	})
	time.Sleep(300 * time.Millisecond)
	p.cc.c.mu.Lock()
	pings := p.cc.c.pingSeq
	p.cc.c.mu.Unlock()
	if pings < 5 {
		t.Errorf("client sent %d PINGs in 300ms at a 10ms interval", pings)
	}
	select {
	case <-p.cc.Done():
		t.Fatal("connection closed although PINGs were acknowledged")
	default:
	}
	s := p.connect(t.Context())
	s.Close()
}

// TestHandlerFailures: a handler that panics or returns without answering
// gets its stream reset with INTERNAL_ERROR; the connection and the server
// keep working.
func TestHandlerFailures(t *testing.T) {
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		switch s.Header().Get("Mode") {
		case "panic":
			panic("handler bug")
		case "return":
			return
		}
		s.Respond(http.StatusOK, nil)
		s.Close()
	}})
	r.Handshake()
	r.Connect(1, rawTarget, "mode", "panic")
	r.WantRST(1, http2.ErrCodeInternal)
	r.Connect(3, rawTarget, "mode", "return")
	r.WantRST(3, http2.ErrCodeInternal)
	r.Connect(5, rawTarget)
	f := r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 5 })
	if f.Header(":status") != "200" {
		t.Errorf("after handler failures: status %q", f.Header(":status"))
	}
}

// TestRefusedAfterGoAway: after a graceful GOAWAY, a stream above its last
// stream id is refused with REFUSED_STREAM (safe to retry) while the open
// stream keeps working.
func TestRefusedAfterGoAway(t *testing.T) {
	srv := &Server{Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(s, s)
		s.Close()
	}}
	r, _ := rawServer(t, srv)
	r.Handshake()
	r.Connect(1, rawTarget)
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(t.Context()) }()
	g := r.WantGoAway(http2.ErrCodeNo)
	if g.Last != 1 {
		t.Errorf("GOAWAY last stream id %d, want 1", g.Last)
	}
	r.Connect(3, rawTarget)
	r.WantRST(3, http2.ErrCodeRefusedStream)
	r.Must(r.Framer.WriteData(1, false, []byte("still here")))
	f := r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameData && f.Stream == 1 })
	if string(f.Data) != "still here" {
		t.Errorf("echo on the old stream: %q", f.Data)
	}
	r.Must(r.Framer.WriteData(1, true, nil))
	r.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FrameRSTStream || f.Flags.Has(http2.FlagDataEndStream) && f.Stream == 1
	})
	r.WantClosed()
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
}

// TestClientAgainstBadServer: the client side checks what a server sends.
func TestClientAgainstBadServer(t *testing.T) {
	tests := []struct {
		name    string
		respond func(r *hbonetest.Peer)
		check   func(err error) bool
		rst     http2.ErrCode // expected RST_STREAM from the client, or 0xff for none
	}{
		{
			name:    "refused stream",
			respond: func(r *hbonetest.Peer) { r.Must(r.Framer.WriteRSTStream(1, http2.ErrCodeRefusedStream)) },
			check:   func(err error) bool { return errors.Is(err, ErrRefused) },
			rst:     0xff,
		},
		{
			name:    "data before response",
			respond: func(r *hbonetest.Peer) { r.Must(r.Framer.WriteData(1, false, []byte("x"))) },
			check: func(err error) bool {
				var re *ResetError
				return errors.As(err, &re) && re.Code == http2.ErrCodeProtocol
			},
			rst: http2.ErrCodeProtocol,
		},
		{
			name:    "missing status",
			respond: func(r *hbonetest.Peer) { r.Headers(1, false, "x", "y") },
			check:   func(err error) bool { return err != nil },
			rst:     http2.ErrCodeProtocol,
		},
		{
			name: "interim then 503",
			respond: func(r *hbonetest.Peer) {
				r.Headers(1, false, ":status", "100")
				r.Headers(1, false, ":status", "503")
			},
			check: func(err error) bool { var se *StatusError; return errors.As(err, &se) && se.Code == 503 },
			rst:   http2.ErrCodeCancel,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc, r := rawServerPeer(t, Config{})
			res := runAsync(func() error {
				s, err := cc.Connect(t.Context(), "a:1", nil)
				if err == nil {
					s.Close()
					return errors.New("Connect succeeded")
				}
				if !tt.check(err) {
					return errors.New("unexpected error: " + err.Error())
				}
				return nil
			})
			r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
			tt.respond(r)
			wait(t, res, "Connect")
			if tt.rst != 0xff {
				r.WantRST(1, tt.rst)
			}
			waitFor(t, func() bool { return cc.ActiveStreams() == 0 }, "stream released")
		})
	}
}

// TestServerIdleTimeout: a peer that keeps its connection alive with PING
// acks but opens no stream is sent GOAWAY and closed after IdleTimeout
// (TESTPLAN 22); a connection with an open stream is not, however long the
// stream lasts, and is closed once it has been idle again that long.
func TestServerIdleTimeout(t *testing.T) {
	const idle = 150 * time.Millisecond
	srv := Config{PingInterval: 10 * time.Millisecond, PingTimeout: time.Second, IdleTimeout: idle}
	cli := Config{PingInterval: 10 * time.Millisecond, PingTimeout: time.Second}

	t.Run("no stream", func(t *testing.T) {
		start := time.Now()
		p := newPair(t, echoHandler, pairOpts{srv: srv, cli: cli})
		select {
		case <-p.cc.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("connection without streams was never closed")
		}
		if d := time.Since(start); d < idle {
			t.Errorf("closed after %v, before the idle timeout %v", d, idle)
		}
		select {
		case err := <-p.served:
			p.served <- err // for the cleanup
			if err != nil {
				t.Errorf("ServeConn = %v; want a clean end after GOAWAY", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("ServeConn did not return after closing the idle connection")
		}
	})

	t.Run("open stream", func(t *testing.T) {
		p := newPair(t, echoHandler, pairOpts{srv: srv, cli: cli})
		s := p.connect(t.Context())
		time.Sleep(3 * idle)
		if _, err := s.Write([]byte("still here")); err != nil {
			t.Fatalf("write on a long stream: %v", err)
		}
		buf := make([]byte, len("still here"))
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatalf("echo on a long stream: %v", err)
		}
		select {
		case <-p.cc.Done():
			t.Fatal("connection closed while a stream was open")
		default:
		}
		s.CloseWrite()
		io.Copy(io.Discard, s)
		s.Close()
		select {
		case <-p.cc.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("connection not closed after its last stream ended and it idled")
		}
	})

	t.Run("off", func(t *testing.T) {
		off := srv
		off.IdleTimeout = -1
		p := newPair(t, echoHandler, pairOpts{srv: off, cli: cli})
		time.Sleep(3 * idle)
		select {
		case <-p.cc.Done():
			t.Fatal("connection closed with the idle timeout off")
		default:
		}
	})
}

// TestSlotFreeWhenEndLeaves: a client at the server's stream limit may open
// its next stream as soon as it reads the end of one, however late the
// goroutine that ended it runs on: the server releases the stream's slot
// before its END_STREAM or RST_STREAM can reach the client. testHookEnded
// holds that goroutine right after the ending frame left (or was queued),
// and the client opens stream 3 meanwhile.
func TestSlotFreeWhenEndLeaves(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status string
		ending func(r *hbonetest.Peer) // the client's side of stream 1's end
	}{
		{"END_STREAM", "200", func(r *hbonetest.Peer) {
			r.Must(r.Framer.WriteData(1, true, nil))
			r.WantEnd(1)
		}},
		{"RST_STREAM", "200", func(r *hbonetest.Peer) { r.WantRST(1, http2.ErrCodeCancel) }},
		{"non-200 answer", "403", func(r *hbonetest.Peer) { r.WantRST(1, http2.ErrCodeNo) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold := make(chan struct{})
			release := sync.OnceFunc(func() { close(hold) })
			defer release()
			hook := func(id uint32) {
				if id == 1 {
					<-hold
				}
			}
			testHookEnded.Store(&hook)
			defer testHookEnded.Store(nil)
			srv := &Server{Config: Config{MaxConcurrentStreams: 1}, Handler: func(s *ServerStream) {
				if tc.status == "403" {
					s.Respond(http.StatusForbidden, nil) // HEADERS END_STREAM, RST_STREAM NO_ERROR
					return
				}
				s.Respond(http.StatusOK, nil)
				if tc.name == "END_STREAM" {
					io.Copy(io.Discard, s) // both ends: the stream is closed
					s.CloseWrite()
					return
				}
				s.Close() // RST_STREAM CANCEL
			}}
			r, _ := rawServer(t, srv)
			r.Handshake()
			r.Connect(1, rawTarget)
			r.WantStatus(1, tc.status)
			tc.ending(r)
			// The server reads frames in order and queues its answers in
			// order: a refusal of stream 3 comes before the PING's ack.
			// Stream 3's handler itself waits for stream 1's to return.
			r.Connect(3, rawTarget)
			r.Must(r.Framer.WritePing(false, [8]byte{3}))
			f := r.Want(func(f hbonetest.Frame) bool {
				return f.Type == http2.FrameGoAway || f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck) ||
					f.Stream == 3 && f.Type == http2.FrameRSTStream
			})
			release()
			if f.Type != http2.FramePing {
				t.Fatalf("stream 3, opened once stream 1 had ended: %v %v, want it served (the server still counted stream 1)", f.Type, f.Code)
			}
			r.WantStatus(3, tc.status)
		})
	}
}
