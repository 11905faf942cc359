package hbone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// earlyIP is the loopback address of this file's listeners.
const earlyIP = "127.93.0.1"

// tcpPairOn returns two connected TCP conns on ip: client end, server end.
func tcpPairOn(t testing.TB, ip string) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	return tcpPairVia(t, ip, &net.Dialer{})
}

// tcpPairVia is tcpPairOn with the client end dialed by d.
func tcpPairVia(t testing.TB, ip string, d *net.Dialer) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	cn, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sn := <-ch
	if sn == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { cn.Close(); sn.Close() })
	return cn.(*net.TCPConn), sn.(*net.TCPConn)
}

// rawServerPeerOn is rawServerPeer on ip, the raw server sending settings.
func rawServerPeerOn(t testing.TB, ip string, cfg Config, settings ...http2.Setting) (*ClientConn, *hbonetest.Peer) {
	t.Helper()
	cn, sn := tcpPairOn(t, ip)
	return rawServerPeerOver(t, cn, sn, cfg, settings...)
}

// TestConnectEarlySendsBeforeResponse: ConnectEarly sends the source's
// bytes right after the CONNECT HEADERS, before the server has answered
// (the raw server waits for them before it answers 200); afterwards the
// source is left readable (deadline cleared, nothing read past the
// response) and the stream carries both ways.
func TestConnectEarlySendsBeforeResponse(t *testing.T) {
	cc, r := rawServerPeerOn(t, earlyIP, Config{})
	app, src := tcpPairOn(t, earlyIP) // app writes; ConnectEarly reads src
	first := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := app.Write(first); err != nil {
		t.Fatal(err)
	}
	type result struct {
		s   *ClientStream
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := cc.ConnectEarly(t.Context(), "10.0.0.1:80", nil, src)
		ch <- result{s, err}
	}()
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	if got := r.WantData(1, len(first)); !bytes.Equal(got, first) {
		t.Fatalf("DATA before the response = %q, want %q", got, first)
	}
	r.Headers(1, false, ":status", "200")
	res := <-ch
	if res.err != nil {
		t.Fatalf("ConnectEarly: %v", res.err)
	}
	s := res.s
	defer s.Close()
	if s.EarlyBytes() != int64(len(first)) {
		t.Errorf("EarlyBytes = %d, want %d", s.EarlyBytes(), len(first))
	}
	// The source is the caller's again: later bytes are not taken.
	if _, err := app.Write([]byte("later")); err != nil {
		t.Fatal(err)
	}
	src.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(src, buf); err != nil || string(buf) != "later" {
		t.Fatalf("source after ConnectEarly read %q, %v; want %q", buf, err, "later")
	}
	r.Must(r.Framer.WriteData(1, false, []byte("response")))
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf = make([]byte, 8)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "response" {
		t.Fatalf("stream read %q, %v", buf, err)
	}
}

// TestConnectEarlyServerSpeaksFirst: with a source that sends nothing,
// ConnectEarly returns on the 200 at once (its pending read is
// interrupted) and the source is readable afterwards.
func TestConnectEarlyServerSpeaksFirst(t *testing.T) {
	cc, r := rawServerPeerOn(t, earlyIP, Config{})
	app, src := tcpPairOn(t, earlyIP)
	connected := connectEarlyAsync(t, cc, r, src)
	r.Headers(1, false, ":status", "200")
	s := connected()
	defer s.Close()
	if s.EarlyBytes() != 0 {
		t.Errorf("EarlyBytes = %d, want 0", s.EarlyBytes())
	}
	app.Write([]byte("x"))
	src.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(src, make([]byte, 1)); err != nil {
		t.Fatalf("source after ConnectEarly: %v", err)
	}
}

// TestConnectEarlyWithinWindow: before the response the client sends no
// more than the peer's initial stream window, and reads no more from the
// source than it sends: the rest stays there for the relay.
func TestConnectEarlyWithinWindow(t *testing.T) {
	const window = 100
	cc, r := rawServerPeerOn(t, earlyIP, Config{}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	app, src := tcpPairOn(t, earlyIP)
	all := payload(7, 1000)
	if _, err := app.Write(all); err != nil {
		t.Fatal(err)
	}
	connected := connectEarlyAsync(t, cc, r, src)
	got := r.WantData(1, window)
	// A PING's ACK comes back after whatever the client wrote before it
	// read the PING: any DATA beyond the window would show up by then.
	r.Must(r.Framer.WritePing(false, [8]byte{1}))
	for {
		f := r.Want(func(f hbonetest.Frame) bool {
			return f.Type == http2.FrameData || f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck)
		})
		if f.Type == http2.FramePing {
			break
		}
		got = append(got, f.Data...)
	}
	if len(got) != window {
		t.Fatalf("client sent %d bytes before the response, window %d", len(got), window)
	}
	r.Headers(1, false, ":status", "200")
	s := connected()
	defer s.Close()
	if s.EarlyBytes() != window {
		t.Errorf("EarlyBytes = %d, want %d", s.EarlyBytes(), window)
	}
	rest := make([]byte, len(all)-window)
	src.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(src, rest); err != nil || !bytes.Equal(append(got, rest...), all) {
		t.Fatalf("early bytes and the source's rest (%v) are not what was written", err)
	}
}

// TestConnectEarlyDenied: a non-200 fails ConnectEarly as it fails Connect,
// and resets the stream.
func TestConnectEarlyDenied(t *testing.T) {
	cc, r := rawServerPeerOn(t, earlyIP, Config{})
	app, src := tcpPairOn(t, earlyIP)
	app.Write([]byte("smuggled"))
	ch := make(chan error, 1)
	go func() {
		_, err := cc.ConnectEarly(t.Context(), "10.0.0.1:80", nil, src)
		ch <- err
	}()
	r.WantData(1, len("smuggled"))
	r.Headers(1, true, ":status", "401")
	select {
	case err := <-ch:
		var se *StatusError
		if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
			t.Fatalf("ConnectEarly = %v, want StatusError 401", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ConnectEarly did not return")
	}
	r.WantRST(1, http2.ErrCodeCancel)
	waitFor(t, func() bool { return cc.ActiveStreams() == 0 }, "stream released")
}

// TestPoolEarlyRetryResends: bytes sent early on a stream the server
// refused (REFUSED_STREAM: not processed) are sent again, byte for byte,
// on the stream the pool retries on another connection, even when that
// connection's stream window is smaller than what was read (the rest is
// sent after the 200).
func TestPoolEarlyRetryResends(t *testing.T) {
	all := payload(11, 5000)
	received := make(chan []byte, 1)
	srv := &Server{Config: Config{StreamWindow: 1 << 10}, Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		b := make([]byte, len(all))
		_, err := io.ReadFull(s, b)
		if err != nil {
			b = nil
		}
		received <- b
		s.Close()
	}}
	refused := make(chan []byte, 1)
	var dials atomic.Int32
	p := NewPool(PoolConfig{Dial: func(ctx context.Context, key Key) (*ClientConn, error) {
		if dials.Add(1) == 1 {
			// A raw server that refuses the first stream once its early
			// bytes have arrived.
			cc, r := rawServerPeerOn(t, earlyIP, Config{})
			go func() {
				r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
				got := r.WantData(1, len(all))
				r.Must(r.Framer.WriteRSTStream(1, http2.ErrCodeRefusedStream))
				refused <- got
			}()
			return cc, nil
		}
		cn, sn := tcpPairOn(t, earlyIP)
		go srv.ServeConn(context.Background(), sn)
		t.Cleanup(func() { srv.Close() })
		return NewClientConn(ctx, cn, Config{})
	}})
	defer p.Close()
	app, src := tcpPairOn(t, earlyIP)
	if _, err := app.Write(all); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := p.ConnectEarly(ctx, testKey, "10.0.0.2:80", nil, src)
	if err != nil {
		t.Fatalf("ConnectEarly: %v", err)
	}
	defer s.Close()
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2 (the retry on a new connection)", n)
	}
	if got := <-refused; !bytes.Equal(got, all) {
		t.Errorf("refused stream got %d early bytes, want the %d written", len(got), len(all))
	}
	select {
	case got := <-received:
		if !bytes.Equal(got, all) {
			t.Fatalf("retried stream delivered %d bytes that differ from the %d written", len(got), len(all))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("retried stream delivered nothing")
	}
	if s.EarlyBytes() != int64(len(all)) {
		t.Errorf("EarlyBytes = %d, want %d", s.EarlyBytes(), len(all))
	}
}

// closingPool is a pool whose every connection goes to a raw server that
// closes it, unanswered, once it has read a frame of type typ on stream 1;
// dials counts the connections.
func closingPool(t *testing.T, typ http2.FrameType) (p *Pool, dials *atomic.Int32) {
	dials = new(atomic.Int32)
	p = NewPool(PoolConfig{Dial: func(ctx context.Context, key Key) (*ClientConn, error) {
		dials.Add(1)
		cc, r := rawServerPeerOn(t, earlyIP, Config{})
		go func() {
			r.Want(func(f hbonetest.Frame) bool { return f.Type == typ && f.Stream == 1 })
			r.Conn.Close()
		}()
		return cc, nil
	}})
	t.Cleanup(func() { p.Close() })
	return p, dials
}

// TestPoolEarlyLostNotRetried: a connection lost, unanswered, after the
// stream took early bytes is not retried (the server may have delivered
// them); before any byte was sent it is, as for Connect.
func TestPoolEarlyLostNotRetried(t *testing.T) {
	p, dials := closingPool(t, http2.FrameData)
	app, src := tcpPairOn(t, earlyIP)
	app.Write([]byte("once only"))
	_, err := p.ConnectEarly(t.Context(), testKey, "10.0.0.2:80", nil, src)
	if !errors.Is(err, ErrConnClosed) || errors.Is(err, ErrRefused) {
		t.Fatalf("ConnectEarly = %v, want ErrConnClosed, not ErrRefused", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: no retry after early bytes were sent", n)
	}
}

// TestPoolEarlyLostBeforeBytesRetried: a connection lost, unanswered, before
// the stream took any early byte is retried on another one, as for Connect.
func TestPoolEarlyLostBeforeBytesRetried(t *testing.T) {
	p, dials := closingPool(t, http2.FrameHeaders)
	_, src := tcpPairOn(t, earlyIP) // the client sends nothing
	if _, err := p.ConnectEarly(t.Context(), testKey, "10.0.0.2:80", nil, src); err == nil {
		t.Fatal("ConnectEarly succeeded on connections that all close unanswered")
	}
	if n := dials.Load(); n < 2 {
		t.Errorf("%d dials, want a retry: no early byte had been sent", n)
	}
}

// failingSource returns its bytes, then a read error; failed, if set, is
// closed when it first returns the error.
type failingSource struct {
	b      []byte
	err    error
	failed chan struct{}
}

func (f *failingSource) Read(p []byte) (int, error) {
	if len(f.b) == 0 {
		if f.failed != nil {
			close(f.failed)
			f.failed = nil
		}
		return 0, f.err
	}
	n := copy(p, f.b)
	f.b = f.b[n:]
	return n, nil
}

func (f *failingSource) SetReadDeadline(time.Time) error { return nil }

// TestConnectEarlySourceFails: a source that fails (a reset client) after
// some bytes, before the response: the bytes are sent, and once answered
// the stream is aborted with CONNECT_ERROR, as the relay would abort it on
// that failure. (A failure after the response is the relay's to see: the
// server answers only once the source has failed, or the early sender could
// be halted before its read of the failure.)
func TestConnectEarlySourceFails(t *testing.T) {
	cc, r := rawServerPeerOn(t, earlyIP, Config{})
	failed := make(chan struct{})
	src := &failingSource{b: []byte("partial"), err: errors.New("connection reset by peer"), failed: failed}
	ch := make(chan error, 1)
	go func() {
		s, err := cc.ConnectEarly(t.Context(), "10.0.0.1:80", nil, src)
		if err == nil && s.EarlyBytes() != int64(len("partial")) {
			err = errors.New("EarlyBytes = " + itoa(int(s.EarlyBytes())))
		}
		ch <- err
	}()
	if got := r.WantData(1, len("partial")); string(got) != "partial" {
		t.Fatalf("DATA %q", got)
	}
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the early sender never read the source's failure")
	}
	r.Headers(1, false, ":status", "200")
	wait(t, ch, "ConnectEarly")
	r.WantRST(1, http2.ErrCodeConnect)
}

// trySource holds bytes that TryRead returns at once; its Read, which
// ConnectEarly must not need, counts its calls and returns EOF.
type trySource struct {
	b     []byte
	reads atomic.Int32
}

func (s *trySource) TryRead(p []byte) (int, error) {
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

func (s *trySource) Read(p []byte) (int, error) {
	s.reads.Add(1)
	return 0, io.EOF
}

func (s *trySource) SetReadDeadline(time.Time) error { return nil }

// TestConnectEarlyTryRead: bytes a source already holds (TryRead) leave
// with the HEADERS, before the response, and within the peer's window: the
// rest of what was taken follows the 200. No reader waits on the source.
func TestConnectEarlyTryRead(t *testing.T) {
	const window = 100
	cc, r := rawServerPeerOn(t, earlyIP, Config{}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	all := payload(3, 300)
	src := &trySource{b: all}
	connected := connectEarlyAsync(t, cc, r, src)
	got := r.WantData(1, window)
	r.Headers(1, false, ":status", "200")
	r.Must(r.Framer.WriteWindowUpdate(1, 1<<20))
	got = append(got, r.WantData(1, len(all)-window)...)
	s := connected()
	defer s.Close()
	if !bytes.Equal(got, all) {
		t.Fatalf("stream carried %d bytes that are not the %d the source held", len(got), len(all))
	}
	if s.EarlyBytes() != int64(len(all)) {
		t.Errorf("EarlyBytes = %d, want %d", s.EarlyBytes(), len(all))
	}
	if n := src.reads.Load(); n != 0 {
		t.Errorf("source read %d times: a reader waited although its bytes were there", n)
	}
}

// heldSource holds bytes that TryRead returns at once, as much as fits,
// and Read the rest of, then EOF.
type heldSource struct{ failingSource }

func (s *heldSource) TryRead(p []byte) (int, error) { return s.Read(p) }

// TestConnectEarlyBeyondFirstRead: when the bytes a source already holds
// fill TryRead's whole buffer, the rest is read and sent before the
// response too, within the peer's window, as ConnectEarly promises.
func TestConnectEarlyBeyondFirstRead(t *testing.T) {
	cc, r := rawServerPeerOn(t, earlyIP, Config{}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 64 << 10})
	all := payload(4, earlyFirstBuf+1000)
	connected := connectEarlyAsync(t, cc, r, &heldSource{failingSource{b: all, err: io.EOF}})
	got := r.WantData(1, len(all))
	r.Headers(1, false, ":status", "200")
	s := connected()
	defer s.Close()
	if !bytes.Equal(got, all) {
		t.Fatalf("stream carried %d bytes before the response that are not the %d the source held", len(got), len(all))
	}
}

// connectEarlyAsync starts cc.ConnectEarly from src and waits until the raw
// server r sees its HEADERS (stream 1); connected waits for ConnectEarly
// and returns its stream, failing the test on an error or a timeout.
func connectEarlyAsync(t *testing.T, cc *ClientConn, r *hbonetest.Peer, src EarlySource) (connected func() *ClientStream) {
	t.Helper()
	ch := make(chan error, 1)
	var s *ClientStream
	go func() {
		var err error
		s, err = cc.ConnectEarly(t.Context(), "10.0.0.1:80", nil, src)
		ch <- err
	}()
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	return func() *ClientStream {
		t.Helper()
		wait(t, ch, "ConnectEarly")
		return s
	}
}

// TestPoolEarlyRetriedOffDrainingServer: a connection that reaches a server
// after its Shutdown began (accepted just before the listener closed, in an
// upgrade overlap) is answered with a GOAWAY that processed no stream, so a
// tunnel that already sent early bytes on it is retried on a new
// connection, with the same bytes, instead of failing.
func TestPoolEarlyRetriedOffDrainingServer(t *testing.T) {
	old := &Server{Handler: func(s *ServerStream) { s.Respond(http.StatusOK, nil); s.Close() }}
	if err := old.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	live := &Server{Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		b, _ := io.ReadAll(s)
		got <- b
		s.Close()
	}}
	defer live.Close()
	oldDone := make(chan error, 1)
	var dials atomic.Int32
	p := NewPool(PoolConfig{Dial: func(ctx context.Context, key Key) (*ClientConn, error) {
		cn, sn := tcpPairOn(t, earlyIP)
		if dials.Add(1) == 1 {
			go func() { oldDone <- old.ServeConn(context.Background(), sn) }()
		} else {
			go live.ServeConn(context.Background(), sn)
		}
		return NewClientConn(ctx, cn, Config{})
	}})
	defer p.Close()
	app, src := tcpPairOn(t, earlyIP)
	msg := []byte("client speaks first")
	if _, err := app.Write(msg); err != nil {
		t.Fatal(err)
	}
	app.CloseWrite()
	s, err := p.ConnectEarly(t.Context(), testKey, "10.0.0.2:80", nil, src)
	if err != nil {
		t.Fatalf("ConnectEarly after the first server began draining: %v (%d dials)", err, dials.Load())
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2: the draining server's, then the live one's", n)
	}
	// What the response came before is relayed after it, as the proxy does.
	if _, err := io.Copy(s, src); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	select {
	case b := <-got:
		if !bytes.Equal(b, msg) {
			t.Errorf("the live server read %q, want %q", b, msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the live server's handler never finished")
	}
	s.Close()
	select {
	case err := <-oldDone:
		if !errors.Is(err, ErrServerClosed) {
			t.Errorf("ServeConn on the draining server = %v, want ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn on the draining server did not return")
	}
}

// TestConnectEarlyPooledChunks: the early buffers are pooled chunks shared
// by all connects, so many concurrent ConnectEarly calls, each with bytes
// of its own (some beyond the first chunk, so that it is swapped for a
// larger buffer when the 200 is slow enough), must each carry exactly
// their own bytes: a chunk given back while a write of it was still
// possible would mix them up.
func TestConnectEarlyPooledChunks(t *testing.T) {
	cn, sn := tcpPairOn(t, earlyIP)
	srv := &Server{Handler: echoHandler}
	go srv.ServeConn(context.Background(), sn)
	t.Cleanup(func() { srv.Close() })
	cc, err := NewClientConn(context.Background(), cn, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	const n = 40
	errs := make(chan error, n)
	for i := range n {
		go func() {
			size := 100 + i*97
			if i%4 == 0 {
				size = earlyFirstBuf + 500*i
			}
			all := payload(uint64(100+i), size)
			src := &heldSource{failingSource{b: all, err: io.EOF}}
			s, err := cc.ConnectEarly(t.Context(), "10.0.0.1:80", nil, src)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			// What the early sender had not read when the 200 came is
			// left in src for the relay, which this copy plays.
			if _, err := io.Copy(s, src); err != nil {
				errs <- fmt.Errorf("connect %d: sending the rest: %w", i, err)
				return
			}
			s.CloseWrite()
			got, err := io.ReadAll(s)
			switch {
			case err != nil:
				errs <- err
			case !bytes.Equal(got, all):
				errs <- fmt.Errorf("connect %d: echoed %d bytes that are not the %d it sent early", i, len(got), len(all))
			default:
				errs <- nil
			}
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
