package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pushDest is a PushTo destination for tests. TryWrite takes a random prefix
// of what it is offered (often nothing), Write takes everything; while the
// gate is closed TryWrite takes nothing and Write blocks. It records the
// bytes, how many calls each path got, and any overlapping calls (PushTo
// promises one caller at a time).
type pushDest struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	rng     *rand.Rand
	tries   int
	writes  int
	failErr error // returned by every call once set

	gate    chan struct{} // nil: open
	inCall  atomic.Int32
	overlap atomic.Bool

	doneCalls atomic.Int32
	done      chan error // receives done's argument
}

func newPushDest(seed uint64) *pushDest {
	return &pushDest{rng: rand.New(rand.NewPCG(seed, 3)), done: make(chan error, 4)}
}

func (d *pushDest) enter() {
	if d.inCall.Add(1) > 1 {
		d.overlap.Store(true)
	}
}

func (d *pushDest) TryWrite(p []byte) (int, error) {
	d.enter()
	defer d.inCall.Add(-1)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tries++
	if d.failErr != nil {
		return 0, d.failErr
	}
	if d.gate != nil {
		return 0, nil
	}
	n := 0
	if d.rng.IntN(3) > 0 {
		n = d.rng.IntN(len(p) + 1)
	}
	d.buf.Write(p[:n])
	return n, nil
}

func (d *pushDest) Write(p []byte) (int, error) {
	d.enter()
	defer d.inCall.Add(-1)
	d.mu.Lock()
	gate := d.gate
	d.mu.Unlock()
	if gate != nil {
		<-gate
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	if d.failErr != nil {
		return 0, d.failErr
	}
	d.buf.Write(p)
	return len(p), nil
}

func (d *pushDest) finish(err error) {
	d.doneCalls.Add(1)
	d.done <- err
}

func (d *pushDest) bytes() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Clone(d.buf.Bytes())
}

// waitDone returns the error done was called with, failing the test if it
// is not called within the timeout or is called more than once.
func (d *pushDest) waitDone(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		time.Sleep(10 * time.Millisecond) // a second call would come now
		if n := d.doneCalls.Load(); n != 1 {
			t.Errorf("done called %d times, want once", n)
		}
		if d.overlap.Load() {
			t.Error("destination methods were called concurrently")
		}
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("done was not called")
		return nil
	}
}

// plainWriter hides pushDest's TryWrite: every byte goes through a drainer.
type plainWriter struct{ d *pushDest }

func (w plainWriter) Write(p []byte) (int, error) { return w.d.Write(p) }

// pushHandler answers 200 and pushes the stream into the destination the
// test registered for it, then returns: a pushed stream needs no goroutine.
type pushHandler struct {
	mu    sync.Mutex
	dests []io.Writer
	ends  []func(error)
	srv   []*ServerStream
}

func (h *pushHandler) add(w io.Writer, done func(error)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dests = append(h.dests, w)
	h.ends = append(h.ends, done)
}

func (h *pushHandler) serve(s *ServerStream) {
	if err := s.Respond(http.StatusOK, nil); err != nil {
		return
	}
	h.mu.Lock()
	w, done := h.dests[0], h.ends[0]
	h.dests, h.ends = h.dests[1:], h.ends[1:]
	h.srv = append(h.srv, s)
	h.mu.Unlock()
	if err := s.PushTo(w, done); err != nil {
		done(err)
	}
}

func (h *pushHandler) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.srv {
		s.Close()
	}
}

// TestPushToPayload pushes a large random payload, sent in random pieces
// through small windows and frames, into destinations that take random
// prefixes (so the reader's attempts and the drainers share the work) or
// only blocking writes; the destination must get every byte in order and
// done must be called once with nil after END_STREAM.
func TestPushToPayload(t *testing.T) {
	small := Config{StreamWindow: 64 << 10, ConnWindow: 256 << 10, MaxFrameSize: 16 << 10}
	// Frames of many chunks: a partial write of one chunk leaves others
	// queued behind it.
	big := Config{StreamWindow: 2 << 20, ConnWindow: 4 << 20, MaxFrameSize: 1 << 20}
	for _, tc := range []struct {
		name string
		cfg  Config
		try  bool
	}{
		{"try-write/small-frames", small, true},
		{"try-write/large-frames", big, true},
		{"write-only", small, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &pushHandler{}
			p := newPair(t, h.serve, pairOpts{srv: tc.cfg, cli: tc.cfg})
			defer h.closeAll()
			d := newPushDest(1)
			var w io.Writer = d
			if !tc.try {
				w = plainWriter{d}
			}
			h.add(w, d.finish)
			s := p.connect(context.Background())
			defer s.Close()
			want := payload(5, 4<<20)
			if err := writeChunks(s, want, 2, 600<<10); err != nil {
				t.Fatalf("write: %v", err)
			}
			s.CloseWrite()
			if err := d.waitDone(t); err != nil {
				t.Fatalf("done(%v), want done(nil)", err)
			}
			if got := d.bytes(); !bytes.Equal(got, want) {
				t.Fatalf("destination got %d bytes, want %d; equal prefix %d", len(got), len(want), commonPrefix(got, want))
			}
			if tc.try && (d.tries == 0 || d.writes == 0) {
				t.Errorf("TryWrite called %d times, Write %d times; want both used", d.tries, d.writes)
			}
			if !tc.try && d.tries != 0 {
				t.Errorf("TryWrite called %d times on a writer without it", d.tries)
			}
		})
	}
}

func commonPrefix(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// TestPushToSlowDestination: a destination that takes nothing holds at most
// its stream window of the peer's bytes, and does not stall the other
// streams of the connection (the reader never blocks on it). Once it takes
// bytes again, everything arrives.
func TestPushToSlowDestination(t *testing.T) {
	small := Config{StreamWindow: 64 << 10, ConnWindow: 128 << 10, MaxFrameSize: 16 << 10}
	var h pushHandler
	p := newPair(t, func(s *ServerStream) {
		if s.Header().Get("Mode") == "echo" {
			echoHandler(s)
			return
		}
		h.serve(s)
	}, pairOpts{srv: small, cli: small})
	defer h.closeAll()
	d := newPushDest(2)
	d.gate = make(chan struct{})
	h.add(d, d.finish)
	slow := p.connect(context.Background())
	defer slow.Close()
	want := payload(6, 1<<20)
	wrote := runAsync(func() error {
		if err := writeChunks(slow, want, 3, 64<<10); err != nil {
			return err
		}
		return slow.CloseWrite()
	})
	waitFor(t, func() bool {
		slow.mu.Lock()
		defer slow.mu.Unlock()
		return slow.sendWin == 0
	}, "the slow stream to spend its window")

	// Several times the connection window on other streams.
	for i := range 4 {
		s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", http.Header{"Mode": {"echo"}})
		if err != nil {
			t.Fatal(err)
		}
		msg := payload(uint64(10+i), 256<<10)
		w := runAsync(func() error {
			if err := writeChunks(s, msg, 4, 32<<10); err != nil {
				return err
			}
			return s.CloseWrite()
		})
		wait(t, runAsync(func() error { return readAllCompare(s, msg) }), "echo next to a stalled push")
		wait(t, w, "write next to a stalled push")
		s.Close()
	}
	h.mu.Lock()
	srv := h.srv[0]
	h.mu.Unlock()
	srv.mu.Lock()
	buffered := srv.buf.Len()
	srv.mu.Unlock()
	if buffered > int(small.StreamWindow) {
		t.Errorf("stalled push buffers %d bytes, more than the %d-byte stream window", buffered, small.StreamWindow)
	}

	d.mu.Lock()
	close(d.gate)
	d.gate = nil
	d.mu.Unlock()
	wait(t, wrote, "write to the slow stream")
	if err := d.waitDone(t); err != nil {
		t.Fatalf("done(%v), want done(nil)", err)
	}
	if got := d.bytes(); !bytes.Equal(got, want) {
		t.Fatalf("destination got %d bytes, want %d; equal prefix %d", len(got), len(want), commonPrefix(got, want))
	}
}

// TestPushToEnds checks how delivery ends and that done hears it once.
func TestPushToEnds(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name string
		// end ends the stream from the client or server side after the
		// destination got the first bytes.
		end  func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest)
		want error // nil, or the error done must wrap
	}{
		{"peer END_STREAM", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			cli.CloseWrite()
		}, nil},
		{"peer reset CANCEL", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			cli.Close()
		}, nil},
		{"local Close", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			srv.Close()
		}, net.ErrClosed},
		{"local protocol reset", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			srv.resetLocal(0x1) // as if the peer broke the protocol on the stream
		}, &ResetError{}},
		{"destination error", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			d.mu.Lock()
			d.failErr = errBoom
			d.mu.Unlock()
			go cli.Write(make([]byte, 100<<10)) // may block until Close: the failed push stops returning credit
		}, errBoom},
		{"connection closed", func(t *testing.T, p *testPair, cli *ClientStream, srv *ServerStream, d *pushDest) {
			p.cc.Close()
		}, ErrConnClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			small := Config{StreamWindow: 64 << 10, ConnWindow: 128 << 10, MaxFrameSize: 16 << 10}
			h := &pushHandler{}
			p := newPair(t, h.serve, pairOpts{srv: small, cli: small})
			defer h.closeAll()
			d := newPushDest(3)
			h.add(d, d.finish)
			cli := p.connect(context.Background())
			defer cli.Close()
			first := payload(7, 1000)
			if _, err := cli.Write(first); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return len(d.bytes()) == len(first) }, "the first bytes")
			h.mu.Lock()
			srv := h.srv[0]
			h.mu.Unlock()
			tc.end(t, p, cli, srv, d)
			err := d.waitDone(t)
			switch want := tc.want.(type) {
			case nil:
				if err != nil {
					t.Errorf("done(%v), want done(nil)", err)
				}
			case *ResetError:
				if !errors.As(err, &want) {
					t.Errorf("done(%v), want a *ResetError", err)
				}
			default:
				if !errors.Is(err, want) {
					t.Errorf("done(%v), want %v", err, want)
				}
			}
			if got := d.bytes(); !bytes.Equal(got[:min(len(got), len(first))], first) {
				t.Errorf("destination bytes do not start with the first write")
			}
		})
	}
}

// TestPushToDestinationErrorReturnsCredit: bytes dropped after a
// destination error give their connection credit back, so the connection's
// other streams keep flowing well past the connection window.
func TestPushToDestinationErrorReturnsCredit(t *testing.T) {
	small := Config{StreamWindow: 64 << 10, ConnWindow: 64 << 10, MaxFrameSize: 16 << 10}
	var h pushHandler
	p := newPair(t, func(s *ServerStream) {
		if s.Header().Get("Mode") == "echo" {
			echoHandler(s)
			return
		}
		h.serve(s)
	}, pairOpts{srv: small, cli: small})
	defer h.closeAll()
	d := newPushDest(4)
	d.failErr = errors.New("destination gone")
	h.add(d, d.finish)
	bad := p.connect(context.Background())
	defer bad.Close()
	go bad.Write(make([]byte, 60<<10)) // its bytes are dropped
	if err := d.waitDone(t); err == nil {
		t.Fatal("done(nil) after a destination error")
	}
	s, err := p.cc.Connect(context.Background(), "10.0.0.1:80", http.Header{"Mode": {"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msg := payload(9, 512<<10) // eight connection windows
	w := runAsync(func() error {
		if err := writeChunks(s, msg, 5, 16<<10); err != nil {
			return err
		}
		return s.CloseWrite()
	})
	wait(t, runAsync(func() error { return readAllCompare(s, msg) }), "echo after a failed push")
	wait(t, w, "write after a failed push")
}

// TestPushToMisuse: the calls PushTo rules out fail instead of racing the
// pushed delivery.
func TestPushToMisuse(t *testing.T) {
	respond := make(chan struct{})
	results := make(chan error, 4)
	p := newPair(t, func(s *ServerStream) {
		defer s.Close()
		d := newPushDest(5)
		results <- s.PushTo(d, d.finish) // before Respond
		<-respond
		s.Respond(http.StatusOK, nil)
		results <- s.PushTo(d, d.finish)
		results <- s.PushTo(d, d.finish) // twice
		_, err := s.Read(make([]byte, 1))
		results <- err
		<-d.done
	}, pairOpts{})
	cli := connectAsync(t, p.cc)
	if err := <-results; !errors.Is(err, errNotResponded) {
		t.Errorf("PushTo before Respond = %v, want %v", err, errNotResponded)
	}
	close(respond)
	s := <-cli
	if s == nil {
		t.FailNow()
	}
	defer s.Close()
	if err := <-results; err != nil {
		t.Errorf("PushTo = %v", err)
	}
	if err := <-results; !errors.Is(err, errPushing) {
		t.Errorf("second PushTo = %v, want %v", err, errPushing)
	}
	if err := <-results; !errors.Is(err, errPushing) {
		t.Errorf("Read after PushTo = %v, want %v", err, errPushing)
	}
	s.CloseWrite()

	closed := p.connect(context.Background())
	closed.Close()
	d := newPushDest(6)
	if err := closed.PushTo(d, d.finish); !errors.Is(err, net.ErrClosed) {
		t.Errorf("PushTo after Close = %v, want %v", err, net.ErrClosed)
	}
}

// connectAsync opens a stream on a goroutine (its answer may be held back by
// the test's handler) and returns a channel with the stream.
func connectAsync(t *testing.T, cc *ClientConn) <-chan *ClientStream {
	ch := make(chan *ClientStream, 1)
	go func() {
		s, err := cc.Connect(context.Background(), "10.0.0.1:80", nil)
		if err != nil {
			t.Errorf("Connect: %v", err)
			close(ch)
			return
		}
		ch <- s
	}()
	return ch
}

// TestPushIdleStreamsHoldNoGoroutine: pushed streams that have carried
// bytes and gone idle leave no goroutine behind (the handlers returned, and
// the drainers exited once their destinations took everything).
func TestPushIdleStreamsHoldNoGoroutine(t *testing.T) {
	const n = 100
	h := &pushHandler{}
	p := newPair(t, h.serve, pairOpts{srv: Config{MaxConcurrentStreams: 2 * n}, cli: Config{MaxConcurrentStreams: 2 * n}})
	defer h.closeAll()
	before := runtime.NumGoroutine()
	var dests []*pushDest
	var streams []*ClientStream
	for i := range n {
		d := newPushDest(uint64(i))
		h.add(d, d.finish)
		dests = append(dests, d)
		s := p.connect(context.Background())
		streams = append(streams, s)
		if _, err := s.Write(payload(uint64(i), 20<<10)); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, s := range streams {
			s.Close()
		}
	}()
	for _, d := range dests {
		waitFor(t, func() bool { return len(d.bytes()) == 20<<10 }, "pushed bytes")
	}
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before }, "drainers and handlers to exit")
}
