package hbone

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// blackhole is a TCP forwarder in front of an address that can stop
// forwarding: while hole is set, every byte either way is read and dropped,
// as by a peer node whose packets vanish (TESTPLAN F24). Connections
// accepted meanwhile are forwarded the same way, so a dial connects but its
// handshake never completes.
type blackhole struct {
	ln   net.Listener
	to   string
	hole atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T, to string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, to: to}
	b.wg.Go(b.acceptLoop)
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *blackhole) acceptLoop() {
	for {
		down, err := b.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", b.to)
		if err != nil {
			down.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, down, up)
		b.mu.Unlock()
		b.wg.Go(func() { b.forward(up, down) })
		b.wg.Go(func() { b.forward(down, up) })
	}
}

// forward copies src to dst, dropping what it reads while the hole is set.
func (b *blackhole) forward(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// echoStreams answers every CONNECT with 200 and echoes its bytes.
func echoStreams(s *ServerStream) {
	s.Respond(http.StatusOK, nil)
	io.Copy(s, s)
	s.Close()
}

// TestPoolEvictsBlackholedConn (TESTPLAN F24): a pooled connection whose
// peer stops answering is closed by the PING timeout within one interval
// plus one timeout of the hole opening (30 s with the defaults of SPEC
// §2.2), its open stream fails instead of hanging, and once the peer is
// back the next Connect succeeds on a fresh connection. The defaults case
// takes about 30 s; the short one checks the same with 200 ms/400 ms.
func TestPoolEvictsBlackholedConn(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		// bound is the longest the eviction may take: PingInterval +
		// PingTimeout and scheduling slack.
		bound time.Duration
	}{
		{"short", Config{PingInterval: 200 * time.Millisecond, PingTimeout: 400 * time.Millisecond}, 600*time.Millisecond + 2*time.Second},
		{"defaults", Config{}, 30*time.Second + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testBlackholedConn(t, tc.cfg, tc.bound)
		})
	}
}

func testBlackholedConn(t *testing.T, cfg Config, bound time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Config: cfg, Handler: echoStreams}
	var serving sync.WaitGroup
	serving.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serving.Go(func() { srv.ServeConn(context.Background(), c) })
		}
	})
	defer func() {
		ln.Close()
		srv.Close()
		serving.Wait()
	}()
	bh := newBlackhole(t, ln.Addr().String())
	var dials atomic.Int32
	p := NewPool(PoolConfig{Dial: func(ctx context.Context, _ Key) (*ClientConn, error) {
		dials.Add(1)
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", bh.ln.Addr().String())
		if err != nil {
			return nil, err
		}
		cc, err := NewClientConn(ctx, c, cfg)
		if err != nil {
			c.Close()
		}
		return cc, err
	}})
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s1, err := p.Connect(ctx, testKey, "10.0.0.2:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	roundTripStream(t, s1, "before")

	bh.hole.Store(true)
	start := time.Now()
	readErr := runAsync(func() error {
		_, err := s1.Read(make([]byte, 1))
		return err
	})
	select {
	case <-s1.c.done:
		t.Logf("blackholed connection closed after %v (bound %v)", time.Since(start).Round(time.Millisecond), bound)
	case <-time.After(bound):
		t.Fatalf("blackholed connection still open after %v", bound)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("read on the dead connection's stream returned data")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream of the dead connection still blocks its reader")
	}

	bh.hole.Store(false)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	s2, err := p.Connect(ctx2, testKey, "10.0.0.2:80", nil)
	if err != nil {
		t.Fatalf("Connect once the peer is back: %v", err)
	}
	defer s2.Close()
	if s2.c == s1.c || dials.Load() != 2 {
		t.Errorf("Connect after the eviction reused the dead connection (%d dials, want 2)", dials.Load())
	}
	roundTripStream(t, s2, "after")
}

// roundTripStream writes a line on s and requires it echoed.
func roundTripStream(t *testing.T, s *ClientStream, line string) {
	t.Helper()
	if _, err := io.WriteString(s, line+"\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(io.LimitReader(s, int64(len(line)+1)))
	if got, err := r.ReadString('\n'); err != nil || got != line+"\n" {
		t.Fatalf("echo of %q = %q, %v", line, got, err)
	}
}
