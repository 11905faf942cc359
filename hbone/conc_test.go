package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// TestManyStreams runs many echo tunnels on one connection at once.
func TestManyStreams(t *testing.T) {
	p := newPair(t, echoHandler, pairOpts{})
	const streams, size = 64, 300 << 10
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", nil)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			want := payload(uint64(100+i), size+i)
			errs <- echoExchange(s, want, uint64(i), 20<<10)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return p.cc.ActiveStreams() == 0 }, "all streams released")
}

// TestStalledReadersDoNotStallOthers: several streams whose reader never
// reads fill their stream windows; the other streams on the connection keep
// flowing, in both directions, in what is left of the connection window.
// (A connection buffers no more than its window, as ztunnel's does: with
// ztunnel's 16 MiB connection and 4 MiB stream windows, up to three stalled
// streams leave room for the others; TestConnBufferedBoundedByWindow.)
func TestStalledReadersDoNotStallOthers(t *testing.T) {
	small := Config{StreamWindow: 64 << 10, ConnWindow: 256 << 10, MaxFrameSize: 16 << 10}
	stall := make(chan struct{})
	unstall := sync.OnceFunc(func() { close(stall) })
	defer unstall()
	p := newPair(t, func(s *ServerStream) {
		if s.Header().Get("Mode") == "stall" {
			s.Respond(http.StatusOK, nil)
			// Neither reads nor lets the client's writes finish; also
			// writes until the client's window for it is full.
			go s.Write(make([]byte, 1<<20))
			<-stall
			s.Close()
			return
		}
		echoHandler(s)
	}, pairOpts{srv: small, cli: small})

	var writers sync.WaitGroup
	stalledStreams := openStalled(t, p, 3, 1<<20, &writers)
	// Let the stalled streams fill their windows.
	waitFor(t, func() bool { return windowsSpent(p, stalledStreams) }, "stalled streams to spend their windows")

	for i := range 4 {
		s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", nil)
		if err != nil {
			t.Fatal(err)
		}
		want := payload(uint64(i), 1<<20)
		w := runAsync(func() error {
			if err := writeChunks(s, want, 1, 32<<10); err != nil {
				return err
			}
			return s.CloseWrite()
		})
		done := runAsync(func() error { return readAllCompare(s, want) })
		wait(t, done, "echo next to stalled streams")
		wait(t, w, "write next to stalled streams")
		s.Close()
	}
	unstall()
	for _, s := range stalledStreams {
		s.Close()
	}
	writers.Wait()
}

// TestNoDeadlockFullSockets: both peers write more than a socket holds, on
// several streams at once, before either reads. Over net.Pipe (no buffering
// at all) this only completes because neither connection's reader ever waits
// for the write lock.
//
// Each stream writes less than its starting window (a 32nd of the
// connection window): a stream's window grows only as its reader reads, so
// two peers that each write more than that before reading would wait on
// each other, as two HTTP/2 peers of any implementation do past their windows.
func TestNoDeadlockFullSockets(t *testing.T) {
	const streams, size = 8, 384 << 10
	srvDone := make(chan error, streams)
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		want := payload(uint64(len(s.Header().Get("Seed"))), size)
		if err := writeChunks(s, want, 3, 96<<10); err != nil {
			srvDone <- err
			return
		}
		s.CloseWrite()
		srvDone <- readAllCompare(s, want)
	}, pairOpts{pipe: true})
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seed := make([]byte, i+1)
			for j := range seed {
				seed[j] = 'x'
			}
			s, err := p.cc.Connect(context.Background(), "a:1", http.Header{"Seed": {string(seed)}})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			want := payload(uint64(i+1), size)
			if err := writeChunks(s, want, 4, 96<<10); err != nil {
				errs <- err
				return
			}
			s.CloseWrite()
			errs <- readAllCompare(s, want)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("deadlock: streams did not complete")
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for range streams {
		wait(t, srvDone, "server stream")
	}
}

// TestReadDeadline: Read fails with os.ErrDeadlineExceeded after the
// deadline and works again once it is cleared.
func TestReadDeadline(t *testing.T) {
	send := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		<-send
		s.Write([]byte("late"))
		io.Copy(io.Discard, s)
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	s.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	_, err := s.Read(make([]byte, 10))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read error = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Errorf("Read returned after %v", d)
	}
	s.SetReadDeadline(time.Time{})
	close(send)
	b := make([]byte, 10)
	n, err := io.ReadAtLeast(s, b, 4)
	if err != nil || string(b[:n]) != "late" {
		t.Fatalf("Read after clearing = %q, %v", b[:n], err)
	}
}

// TestWriteDeadline: Write blocked on flow control fails at the deadline.
func TestWriteDeadline(t *testing.T) {
	release := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release // never reads
		s.Close()
	}, pairOpts{srv: Config{StreamWindow: 1 << 16}})
	defer close(release)
	s := p.connect(context.Background())
	defer s.Close()
	s.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := s.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write error = %v, want deadline exceeded", err)
	}
	if n != 1<<16 {
		t.Errorf("Write wrote %d bytes, want the stream window %d", n, 1<<16)
	}
}

// TestConnectContextCancel: canceling the context while waiting for the
// response resets the stream with CANCEL and returns the context's error.
func TestConnectContextCancel(t *testing.T) {
	reset := make(chan error, 1)
	p := newPair(t, func(s *ServerStream) {
		// Never answers; reads until the client's reset.
		_, err := s.Read(make([]byte, 1))
		reset <- err
		s.Respond(http.StatusServiceUnavailable, nil)
	}, pairOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.cc.Connect(ctx, "10.0.0.1:80", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect error = %v, want deadline exceeded", err)
	}
	if err := <-reset; err != io.EOF {
		t.Errorf("server read %v after the client's CANCEL, want EOF", err)
	}
	waitFor(t, func() bool { return p.cc.ActiveStreams() == 0 }, "client stream released")
}

// TestServerShutdown: Shutdown sends GOAWAY, lets the open stream finish,
// refuses new streams, and returns once the connection is drained.
func TestServerShutdown(t *testing.T) {
	proceed := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		<-proceed
		io.Copy(s, s)
		s.CloseWrite()
	}, pairOpts{})
	s := p.connect(context.Background())
	shut := runAsync(func() error { return p.srv.Shutdown(context.Background()) })
	waitFor(t, func() bool { return !p.cc.CanTakeNewStream() }, "client to see GOAWAY")
	if _, err := p.cc.Connect(context.Background(), "a:1", nil); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("Connect after GOAWAY = %v, want ErrNoCapacity", err)
	}
	close(proceed)
	want := payload(5, 1<<20)
	if err := echoExchange(s, want, 1, 64<<10); err != nil {
		t.Fatalf("stream during shutdown: %v", err)
	}
	s.Close()
	wait(t, shut, "Shutdown")
	select {
	case err := <-p.served:
		p.served <- err // for cleanup
		if err != nil {
			t.Errorf("ServeConn after drain = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeConn did not return after Shutdown")
	}
	select {
	case <-p.cc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client connection not closed after drain")
	}
	a, b := net.Pipe()
	b.Close()
	if err := p.srv.ServeConn(context.Background(), a); !errors.Is(err, ErrServerClosed) {
		t.Errorf("ServeConn after Shutdown = %v, want ErrServerClosed", err)
	}
}

// TestServerShutdownForce: when ctx ends before the streams do, Shutdown
// closes everything and returns ctx's error.
func TestServerShutdownForce(t *testing.T) {
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(io.Discard, s) // until the connection dies
		s.Close()
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Errorf("Read on a force-closed connection succeeded")
	}
	// Idempotent.
	if err := p.srv.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
}

// TestClientGoAway: a client that receives GOAWAY stops taking streams and
// lets the open one finish; a stream above the GOAWAY's last stream id fails
// with ErrRefused.
func TestClientGoAway(t *testing.T) {
	cc, r := rawServerPeer(t, Config{})
	type res struct {
		s   *ClientStream
		err error
	}
	first := make(chan res, 1)
	go func() {
		s, err := cc.Connect(context.Background(), "a:1", nil)
		first <- res{s, err}
	}()
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 1 })
	second := make(chan res, 1)
	go func() {
		s, err := cc.Connect(context.Background(), "a:1", nil)
		second <- res{s, err}
	}()
	r.Want(func(f hbonetest.Frame) bool { return f.Type == http2.FrameHeaders && f.Stream == 3 })
	r.Must(r.Framer.WriteGoAway(1, http2.ErrCodeNo, nil))
	if got := <-second; !errors.Is(got.err, ErrRefused) {
		t.Errorf("stream above GOAWAY: %v, want ErrRefused", got.err)
	}
	waitFor(t, func() bool { return !cc.CanTakeNewStream() }, "CanTakeNewStream false")
	r.Headers(1, false, ":status", "200")
	got := <-first
	if got.err != nil {
		t.Fatalf("stream below GOAWAY: %v", got.err)
	}
	r.Must(r.Framer.WriteData(1, true, []byte("bye")))
	b, err := io.ReadAll(got.s)
	if err != nil || string(b) != "bye" {
		t.Errorf("read %q, %v", b, err)
	}
	got.s.CloseWrite()
	r.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FrameData && f.Stream == 1 && f.Flags.Has(http2.FlagDataEndStream)
	})
	// Both directions ended and GOAWAY was received: the client closes.
	select {
	case <-cc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client did not close after its last stream")
	}
}

// TestClientPingTimeout: a server that never acknowledges PINGs loses the
// client connection.
func TestClientPingTimeout(t *testing.T) {
	cc, _ := rawServerPeer(t, Config{PingInterval: 50 * time.Millisecond, PingTimeout: 200 * time.Millisecond})
	select {
	case <-cc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client connection survived unacknowledged PINGs")
	}
}

// TestNewClientConnTimeout: NewClientConn gives up when the peer never
// sends SETTINGS, and closes the connection.
func TestNewClientConnTimeout(t *testing.T) {
	cn, sn := connPair(t, false)
	defer sn.Close()
	go io.Copy(io.Discard, sn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := NewClientConn(ctx, cn, Config{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NewClientConn = %v, want deadline exceeded", err)
	}
	if _, err := cn.Write([]byte("x")); err == nil {
		t.Errorf("connection still open after a failed NewClientConn")
	}
}

// TestClientShutdown: the client's GOAWAY stops new streams, the open one
// finishes, then the connection closes; with an expired ctx it closes at once.
func TestClientShutdown(t *testing.T) {
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(s, s)
		s.CloseWrite()
		s.Close()
	}, pairOpts{})
	s := p.connect(context.Background())
	shut := runAsync(func() error { return p.cc.Shutdown(context.Background()) })
	waitFor(t, func() bool { return !p.cc.CanTakeNewStream() }, "GOAWAY sent")
	if _, err := p.cc.Connect(context.Background(), "a:1", nil); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("Connect during Shutdown = %v, want ErrNoCapacity", err)
	}
	s.Write([]byte("last words"))
	s.CloseWrite()
	b, err := io.ReadAll(s)
	if err != nil || string(b) != "last words" {
		t.Errorf("open stream during Shutdown read %q, %v", b, err)
	}
	s.Close()
	wait(t, shut, "Shutdown")
	select {
	case <-p.cc.Done():
	default:
		t.Error("connection open after Shutdown returned")
	}

	q := newPair(t, echoHandler, pairOpts{})
	s2 := q.connect(context.Background())
	defer s2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := q.cc.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a stream open = %v, want deadline exceeded", err)
	}
	if _, err := s2.Write([]byte("x")); err == nil {
		t.Error("stream survived a forced Shutdown")
	}
}

// TestMultiplexStalledStreams (TESTPLAN L4, liveness): on one connection with
// the default windows (4 MiB largest stream window, 16 MiB connection
// window), 10 streams whose handler never reads and whose client writes
// 4 MiB each leave the other 90 streams flowing: each of them delivers its
// bytes exactly. With every stream given the whole 4 MiB at once, the stalled
// ones would hold all of the connection window after four, and the rest would
// wait forever.
func TestMultiplexStalledStreams(t *testing.T) {
	const stalled, active, perActive = 10, 90, 256 << 10
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		if s.Header().Get("Mode") == "stall" {
			<-release
			s.Close()
			return
		}
		n, _ := io.Copy(io.Discard, s)
		s.Write([]byte(itoa(int(n))))
		s.Close()
	}, pairOpts{})

	var writers sync.WaitGroup
	stalledStreams := openStalled(t, p, stalled, 4<<20, &writers)
	waitFor(t, func() bool { return windowsSpent(p, stalledStreams) }, "the stalled streams to spend their windows")

	results := make(chan error, active)
	for i := range active {
		s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", nil)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer s.Close()
			want := payload(uint64(i), perActive)
			if err := writeChunks(s, want, uint64(i), 64<<10); err != nil {
				results <- err
				return
			}
			if err := s.CloseWrite(); err != nil {
				results <- err
				return
			}
			got, err := io.ReadAll(s)
			if err == nil && string(got) != itoa(perActive) {
				err = fmt.Errorf("stream %d: handler read %s bytes, want %d", i, got, perActive)
			}
			results <- err
		}()
	}
	for range active {
		wait(t, results, "an active stream next to 10 stalled ones")
	}
	close(release)
	for _, s := range stalledStreams {
		s.Close()
	}
	writers.Wait()
}

// TestStreamWindowGrows: a stream starts with a 32nd of the connection
// window and, as its reader keeps up, grows to the largest stream window, so
// a single fast stream is not held to the starting window.
func TestStreamWindowGrows(t *testing.T) {
	got := make(chan [2]int64, 1)
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		s.mu.Lock()
		start := s.win
		s.mu.Unlock()
		io.Copy(io.Discard, s)
		s.mu.Lock()
		end := s.win
		s.mu.Unlock()
		got <- [2]int64{start, end}
		s.Close()
	}, pairOpts{})
	s := p.connect(context.Background())
	if err := writeChunks(s, payload(1, 8<<20), 1, 256<<10); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	io.Copy(io.Discard, s)
	w := <-got
	if w[0] != defaultConnWindow/32 || w[1] != defaultStreamWindow {
		t.Errorf("stream window started at %d and ended at %d, want %d then %d", w[0], w[1], defaultConnWindow/32, defaultStreamWindow)
	}
}

// openStalled opens n streams with header Mode: stall, each with a writer of
// size bytes in writers that blocks once the stream's window is spent.
func openStalled(t *testing.T, p *testPair, n, size int, writers *sync.WaitGroup) []*ClientStream {
	t.Helper()
	var streams []*ClientStream
	for range n {
		s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", http.Header{"Mode": {"stall"}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
		writers.Add(1)
		go func() {
			defer writers.Done()
			s.Write(make([]byte, size))
		}()
	}
	return streams
}

// windowsSpent reports whether every one of streams has spent its send
// window, or together they spent the connection's.
func windowsSpent(p *testPair, streams []*ClientStream) bool {
	p.cc.c.mu.Lock()
	connWin := p.cc.c.sendWin
	p.cc.c.mu.Unlock()
	if connWin <= 0 {
		return true
	}
	for _, s := range streams {
		s.mu.Lock()
		w := s.sendWin
		s.mu.Unlock()
		if w > 0 {
			return false
		}
	}
	return true
}
