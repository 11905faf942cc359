package hbone

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poolEnv is a Server reachable through a counting DialFunc.
type poolEnv struct {
	t       *testing.T
	srv     *Server
	dials   atomic.Int32
	serving sync.WaitGroup
	fail    atomic.Pointer[error]
	gate    chan struct{} // if non-nil, dials wait for it
}

func newPoolEnv(t *testing.T, h Handler) *poolEnv {
	e := &poolEnv{t: t, srv: &Server{Handler: h}}
	t.Cleanup(func() {
		e.srv.Close()
		e.serving.Wait()
	})
	return e
}

func (e *poolEnv) dial(ctx context.Context, key Key) (*ClientConn, error) {
	e.dials.Add(1)
	if e.gate != nil {
		select {
		case <-e.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := e.fail.Load(); err != nil {
		return nil, *err
	}
	cn, sn := connPair(e.t, false)
	e.serving.Add(1)
	go func() {
		defer e.serving.Done()
		e.srv.ServeConn(context.Background(), sn)
	}()
	return NewClientConn(ctx, cn, Config{})
}

var testKey = Key{
	SrcIdentity:   "spiffe://cluster.local/ns/a/sa/a",
	DstIdentities: "spiffe://cluster.local/ns/b/sa/b",
	Dst:           netip.MustParseAddrPort("10.0.0.2:15008"),
	SrcIP:         netip.MustParseAddr("10.0.0.1"),
}

// holdHandler answers 200 and holds the stream until the client closes it.
func holdHandler(s *ServerStream) {
	s.Respond(http.StatusOK, nil)
	io.Copy(io.Discard, s)
	s.Close()
}

// connectN opens n streams concurrently and returns them.
func connectN(t *testing.T, p *Pool, key Key, n int) []*ClientStream {
	t.Helper()
	streams := make([]*ClientStream, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streams[i], errs[i] = p.Connect(context.Background(), key, "10.0.0.2:80", nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("Connect: %v", err)
		}
	}
	return streams
}

func closeAll(streams []*ClientStream) {
	for _, s := range streams {
		s.Close()
	}
}

func distinctConns(streams []*ClientStream) map[*conn]int {
	m := make(map[*conn]int)
	for _, s := range streams {
		m[s.c]++
	}
	return m
}

// TestPoolSingleDial: 100 concurrent Connects for one key share one dial.
func TestPoolSingleDial(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	p := NewPool(PoolConfig{Dial: e.dial})
	defer p.Close()
	streams := connectN(t, p, testKey, 100)
	defer closeAll(streams)
	if n := e.dials.Load(); n != 1 {
		t.Errorf("%d dials for 100 concurrent Connects, want 1", n)
	}
}

// TestPoolSpillsOver: past MaxStreamsPerConn a key gets more connections,
// none carrying more than the cap.
func TestPoolSpillsOver(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	p := NewPool(PoolConfig{Dial: e.dial})
	defer p.Close()
	streams := connectN(t, p, testKey, 250)
	defer closeAll(streams)
	conns := distinctConns(streams)
	if len(conns) < 2 {
		t.Errorf("250 streams on %d connection(s), want at least 2", len(conns))
	}
	for _, n := range conns {
		if n > 100 {
			t.Errorf("a connection carries %d streams, cap 100", n)
		}
	}
	if int(e.dials.Load()) != len(conns) {
		t.Errorf("%d dials for %d connections", e.dials.Load(), len(conns))
	}
}

// TestPoolReuseAndKeys: sequential Connects reuse the connection; another
// key gets its own.
func TestPoolReuseAndKeys(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	p := NewPool(PoolConfig{Dial: e.dial})
	defer p.Close()
	a := connectN(t, p, testKey, 1)
	b := connectN(t, p, testKey, 1)
	other := testKey
	other.SrcIP = netip.MustParseAddr("10.0.0.9")
	c := connectN(t, p, other, 1)
	defer closeAll(append(append(a, b...), c...))
	if a[0].c != b[0].c {
		t.Errorf("second Connect for the same key used a new connection")
	}
	if a[0].c == c[0].c {
		t.Errorf("a different source IP shared the connection (SPEC §3.6, TESTPLAN S14)")
	}
	if n := e.dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2", n)
	}
}

// TestPoolDialFailureSingleFlight: concurrent Connects waiting on a dial all
// get its error; the next Connect dials again.
func TestPoolDialFailureSingleFlight(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	e.gate = make(chan struct{})
	boom := errors.New("connection refused")
	e.fail.Store(&boom)
	p := NewPool(PoolConfig{Dial: e.dial})
	defer p.Close()
	const n = 20
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := p.Connect(context.Background(), testKey, "a:1", nil)
			errs <- err
		}()
	}
	waitFor(t, func() bool { return e.dials.Load() == 1 }, "the dial to start")
	time.Sleep(20 * time.Millisecond) // let every Connect queue behind it
	close(e.gate)
	for range n {
		if err := <-errs; !errors.Is(err, boom) {
			t.Errorf("Connect = %v, want the dial error", err)
		}
	}
	if got := e.dials.Load(); got != 1 {
		t.Errorf("%d dials, want 1", got)
	}
	e.fail.Store(nil)
	s := connectN(t, p, testKey, 1)
	s[0].Close()
	if got := e.dials.Load(); got != 2 {
		t.Errorf("%d dials after recovery, want 2", got)
	}
}

// TestPoolSkipsGoAway: a connection that received GOAWAY is never handed
// out again; its open stream finishes.
func TestPoolSkipsGoAway(t *testing.T) {
	e := newPoolEnv(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(s, s)
		s.CloseWrite()
		s.Close()
	})
	p := NewPool(PoolConfig{Dial: e.dial})
	defer p.Close()
	first := connectN(t, p, testKey, 1)[0]
	shut := runAsync(func() error { return e.srv.Shutdown(context.Background()) })
	waitFor(t, func() bool { return !first.c.isUsable() }, "GOAWAY to arrive")
	// The server refuses new connections after Shutdown; use a fresh server.
	e.srv = &Server{Handler: holdHandler}
	second := connectN(t, p, testKey, 1)[0]
	defer second.Close()
	if second.c == first.c {
		t.Fatal("GOAWAY'd connection reused")
	}
	if e.dials.Load() != 2 {
		t.Errorf("%d dials, want 2", e.dials.Load())
	}
	// The old stream still works and then the old connection drains.
	first.Write([]byte("abc"))
	first.CloseWrite()
	b, err := io.ReadAll(first)
	if err != nil || string(b) != "abc" {
		t.Errorf("old stream read %q, %v", b, err)
	}
	first.Close()
	wait(t, shut, "Shutdown")
	e.srv.Close()
}

// TestPoolIdleRelease: a pooled connection unused for IdleTimeout is closed
// and the next Connect dials again.
func TestPoolIdleRelease(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	p := NewPool(PoolConfig{Dial: e.dial, IdleTimeout: 30 * time.Millisecond})
	defer p.Close()
	s := connectN(t, p, testKey, 1)[0]
	cn := s.c
	time.Sleep(60 * time.Millisecond)
	// In use: past the timeout it leaves the pool but stays open.
	select {
	case <-cn.done:
		t.Fatal("connection with an open stream closed by idle release")
	default:
	}
	s.Close()
	select {
	case <-cn.done:
	case <-time.After(5 * time.Second):
		t.Fatal("idle connection not closed after its last stream")
	}
	s2 := connectN(t, p, testKey, 1)[0]
	s2.Close()
	if e.dials.Load() != 2 {
		t.Errorf("%d dials, want 2", e.dials.Load())
	}
	// An unused pooled connection closes on its own.
	waitFor(t, func() bool {
		select {
		case <-s2.c.done:
			return true
		default:
			return false
		}
	}, "idle pooled connection to close")
}

// TestPoolClose: Close closes connections, cancels dials in flight, waits
// for its goroutines (goleak checks), and later Connects fail.
func TestPoolClose(t *testing.T) {
	e := newPoolEnv(t, holdHandler)
	p := NewPool(PoolConfig{Dial: e.dial})
	s := connectN(t, p, testKey, 1)[0]
	e.gate = make(chan struct{}) // the next dial hangs until canceled
	other := testKey
	other.Dst = netip.MustParseAddrPort("10.0.0.3:15008")
	pending := runAsync(func() error {
		_, err := p.Connect(context.Background(), other, "a:1", nil)
		return err
	})
	waitFor(t, func() bool { return e.dials.Load() == 2 }, "second dial")
	p.Close()
	if err := <-pending; err == nil {
		t.Error("Connect during Close succeeded")
	}
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Error("stream survived Pool.Close")
	}
	if _, err := p.Connect(context.Background(), testKey, "a:1", nil); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("Connect after Close = %v, want ErrPoolClosed", err)
	}
}

// TestPoolDialKeepsDeadline: the shared dial is not canceled with the
// Connect that started it, but keeps its deadline.
func TestPoolDialKeepsDeadline(t *testing.T) {
	got := make(chan bool, 1)
	p := NewPool(PoolConfig{Dial: func(ctx context.Context, key Key) (*ClientConn, error) {
		_, ok := ctx.Deadline()
		got <- ok
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	cancelFirst, stop := context.WithCancel(ctx)
	first := runAsync(func() error {
		_, err := p.Connect(cancelFirst, testKey, "a:1", nil)
		return err
	})
	if !<-got {
		t.Fatal("dial context has no deadline")
	}
	second := runAsync(func() error {
		_, err := p.Connect(context.Background(), testKey, "a:1", nil)
		return err
	})
	stop() // the first caller gives up; the dial goes on for the second
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("first Connect = %v, want canceled", err)
	}
	if err := <-second; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Connect = %v, want the dial's deadline error", err)
	}
}
