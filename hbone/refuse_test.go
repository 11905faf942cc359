package hbone

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestGoAwayLastStreamSkipsRefused: streams refused because the connection
// was full, or because it was draining, were not processed, so no GOAWAY
// names them (RFC 9113 §6.8): neither the graceful one nor the final one.
func TestGoAwayLastStreamSkipsRefused(t *testing.T) {
	release := make(chan struct{})
	srv := &Server{Config: Config{MaxConcurrentStreams: 1}, Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		s.Close()
	}}
	r, _ := rawServer(t, srv)
	r.Handshake()
	r.Connect(1, rawTarget)
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	r.Connect(3, rawTarget)
	r.WantRST(3, http2.ErrCodeRefusedStream)

	shut := runAsync(func() error { return srv.Shutdown(t.Context()) })
	defer func() {
		close(release)
		<-shut
	}()
	if g := r.WantGoAway(http2.ErrCodeNo); g.Last != 1 {
		t.Errorf("graceful GOAWAY last stream id %d after stream 3 was refused (full), want 1", g.Last)
	}
	r.Connect(5, rawTarget)
	r.WantRST(5, http2.ErrCodeRefusedStream)
	// A connection error now: the final GOAWAY names the same last stream.
	r.Must(r.Framer.WriteWindowUpdate(0, maxWindow))
	if g := r.WantGoAway(http2.ErrCodeFlowControl); g.Last != 1 {
		t.Errorf("final GOAWAY last stream id %d after stream 5 was refused (draining), want 1", g.Last)
	}
}

// TestDrainRefusalFlood: after GOAWAY every new stream is refused, and a
// peer that floods HEADERS then (reading our answers or not) is cut off with
// ENHANCE_YOUR_CALM once the refusals pass their bound, instead of growing
// the control queue without limit.
func TestDrainRefusalFlood(t *testing.T) {
	const flood = 4 * maxRefusals
	// drainingServer starts a server whose handler holds stream 1 open until
	// release is called, so that Shutdown leaves the connection draining.
	drainingServer := func(t *testing.T) (srv *Server, release func()) {
		ch := make(chan struct{})
		release = sync.OnceFunc(func() { close(ch) })
		t.Cleanup(release)
		return &Server{Handler: func(s *ServerStream) {
			s.Respond(http.StatusOK, nil)
			<-ch
			s.Close()
		}}, release
	}
	floodFrom := func(fr *http2.Framer, block func() []byte) <-chan int {
		sent := make(chan int, 1)
		go func() {
			n := 0
			for id := uint32(3); n < flood; id += 2 {
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(), EndHeaders: true}); err != nil {
					break
				}
				n++
			}
			sent <- n
		}()
		return sent
	}

	t.Run("reading", func(t *testing.T) {
		srv, release := drainingServer(t)
		r, res := rawServer(t, srv)
		r.Handshake()
		r.Connect(1, rawTarget)
		r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
		shut := runAsync(func() error { return srv.Shutdown(t.Context()) })
		defer func() {
			release()
			<-shut
		}()
		r.WantGoAway(http2.ErrCodeNo)
		block := r.Block(":method", "CONNECT", ":authority", "a:1")
		sent := floodFrom(r.Framer, func() []byte { return block })
		// The server sends GOAWAY ENHANCE_YOUR_CALM and closes. While the
		// flood is still arriving, the kernel may reset the connection over
		// the unread bytes and drop that GOAWAY on the way, so what is
		// required is the cut itself, and the reason from ServeConn.
		cut := time.After(10 * time.Second)
	frames:
		for {
			select {
			case f, ok := <-r.Frames():
				if !ok {
					break frames
				}
				if f.Type == http2.FrameGoAway && f.Code != http2.ErrCodeNo && f.Code != http2.ErrCodeEnhanceYourCalm {
					t.Fatalf("GOAWAY code %v, want ENHANCE_YOUR_CALM", f.Code)
				}
			case <-cut:
				t.Fatal("a reading peer flooding HEADERS after GOAWAY was never cut off")
			}
		}
		release()
		if err, ok := res.wait(10 * time.Second); !ok || err == nil || !strings.Contains(err.Error(), "too many refused streams") {
			t.Errorf("ServeConn = %v (returned %v), want the too-many-refusals error", err, ok)
		}
		<-sent
	})

	t.Run("not reading", func(t *testing.T) {
		srv, release := drainingServer(t)
		cn, sn := connPair(t, false)
		defer cn.Close()
		res := &serveResult{ch: make(chan error, 1)}
		go func() { res.ch <- srv.ServeConn(t.Context(), sn) }()
		// A client that writes and never reads a byte.
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		block := func() []byte {
			hbuf.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
			enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "a:1"})
			return hbuf.Bytes()
		}
		fr := http2.NewFramer(cn, nil)
		if _, err := cn.Write([]byte(http2.ClientPreface)); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		sc := serverConnOf(t, srv)
		waitFor(t, func() bool {
			sc.mu.Lock()
			defer sc.mu.Unlock()
			return sc.active == 1
		}, "stream 1 to open")
		shut := runAsync(func() error { return srv.Shutdown(t.Context()) })
		defer func() {
			release()
			srv.Close()
			<-shut
			res.wait(10 * time.Second)
		}()
		waitFor(t, func() bool {
			sc.mu.Lock()
			defer sc.mu.Unlock()
			return sc.goAwaySent
		}, "GOAWAY")
		sent := floodFrom(fr, block)
		select {
		case <-sc.done:
		case <-time.After(10 * time.Second):
			sc.cmu.Lock()
			queued := len(sc.ctrl)
			sc.cmu.Unlock()
			t.Errorf("connection still open after %d refused HEADERS; %d control frames queued", flood, queued)
		}
		cn.Close()
		<-sent
	})
}

// serverConnOf waits for srv's one connection and returns it.
func serverConnOf(t testing.TB, srv *Server) *conn {
	t.Helper()
	var sc *conn
	waitFor(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for c := range srv.conns {
			sc = c
		}
		return sc != nil
	}, "the server's connection")
	return sc
}

// heldHandler answers 200 and leaves the stream to the test, like a handler
// that hands it to a relay and returns; mode "echo" echoes instead. Cleanup
// closes the held streams.
func heldHandler(t testing.TB) Handler {
	held := make(chan *ServerStream, 1024)
	t.Cleanup(func() {
		for {
			select {
			case s := <-held:
				s.Close()
			default:
				return
			}
		}
	})
	return func(s *ServerStream) {
		if s.Header().Get("Mode") == "echo" {
			echoHandler(s)
			return
		}
		s.Respond(http.StatusOK, nil)
		held <- s
	}
}

// wantAnswer waits for the response HEADERS on stream id and fails on a
// reset or GOAWAY instead.
func wantAnswer(t testing.TB, r *hbonetest.Peer, id uint32) {
	t.Helper()
	f := r.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FrameGoAway || f.Stream == id && (f.Type == http2.FrameHeaders || f.Type == http2.FrameRSTStream)
	})
	if f.Type != http2.FrameHeaders || f.Header(":status") != "200" {
		t.Fatalf("stream %d: got %v (code %v, status %q), want a 200", id, f.Type, f.Code, f.Header(":status"))
	}
}

// wantEcho checks that stream id, served by echoHandler, still echoes.
func wantEcho(t testing.TB, r *hbonetest.Peer, id uint32) {
	t.Helper()
	r.Must(r.Framer.WriteData(id, false, []byte("ping")))
	f := r.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FrameGoAway || f.Stream == id && (f.Type == http2.FrameData || f.Type == http2.FrameRSTStream)
	})
	if f.Type != http2.FrameData || string(f.Data) != "ping" {
		t.Fatalf("stream %d: got %v (code %v) %q, want its echo", id, f.Type, f.Code, f.Data)
	}
}

// TestResetStreamFreesSlot: a stream the client reset is closed (RFC 9113
// §5.1) and stops counting against MAX_CONCURRENT_STREAMS at once, even
// while the application still holds it, so a client that opens and resets
// streams within the limit is never refused and its healthy stream lives.
func TestResetStreamFreesSlot(t *testing.T) {
	const limit = 2
	r, _ := rawServer(t, &Server{Config: Config{MaxConcurrentStreams: limit}, Handler: heldHandler(t)})
	r.Handshake()
	r.Connect(1, rawTarget, "mode", "echo")
	wantAnswer(t, r, 1)
	for i := range 3 * maxLocalResets / 2 {
		id := uint32(3 + 2*i)
		r.Connect(id, rawTarget)
		wantAnswer(t, r, id)
		r.Must(r.Framer.WriteRSTStream(id, http2.ErrCodeCancel))
	}
	wantEcho(t, r, 1)
}

// TestRefusalsAreNotAbuse: streams refused because the client went over
// MAX_CONCURRENT_STREAMS do not count as protocol errors: past the
// protocol-error limit the connection and its healthy stream live on.
func TestRefusalsAreNotAbuse(t *testing.T) {
	r, _ := rawServer(t, &Server{Config: Config{MaxConcurrentStreams: 1}, Handler: heldHandler(t)})
	r.Handshake()
	r.Connect(1, rawTarget, "mode", "echo")
	wantAnswer(t, r, 1)
	for i := range 3 * maxLocalResets / 2 {
		id := uint32(3 + 2*i)
		r.Connect(id, rawTarget)
		r.WantRST(id, http2.ErrCodeRefusedStream)
	}
	wantEcho(t, r, 1)
}

// TestPoolRefusedTriesAnotherConn: a stream the server refused is retried on
// another connection, not on the one that refused it.
func TestPoolRefusedTriesAnotherConn(t *testing.T) {
	refusing, r1 := rawServerPeer(t, Config{})
	accepting, r2 := rawServerPeer(t, Config{})
	answer := func(r *hbonetest.Peer, reply func(id uint32)) *atomic.Int32 {
		var n atomic.Int32
		done := make(chan struct{})
		go func() {
			defer close(done)
			for f := range r.Frames() {
				if f.Type == http2.FrameHeaders {
					n.Add(1)
					reply(f.Stream)
				}
			}
		}()
		t.Cleanup(func() {
			r.Conn.Close()
			<-done
		})
		return &n
	}
	refused := answer(r1, func(id uint32) { r1.Framer.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
	answer(r2, func(id uint32) { r2.Headers(id, false, ":status", "200") })
	var dials atomic.Int32
	pool := NewPool(PoolConfig{Dial: func(ctx context.Context, key Key) (*ClientConn, error) {
		if dials.Add(1) == 1 {
			return refusing, nil
		}
		return accepting, nil
	}})
	defer pool.Close()
	s, err := pool.Connect(t.Context(), Key{}, "a:1", nil)
	if err != nil {
		t.Fatalf("Connect = %v after %d requests on the refusing connection", err, refused.Load())
	}
	s.Close()
	if n := refused.Load(); n != 1 {
		t.Errorf("the refusing connection got %d requests, want 1", n)
	}
}
