package hbone

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// chaosConn splits reads and writes into random small pieces with
// occasional pauses, so frames straddle every possible boundary.
type chaosConn struct {
	net.Conn
	mu  sync.Mutex
	rng *rand.Rand
}

func newChaosConn(c net.Conn, seed uint64) *chaosConn {
	return &chaosConn{Conn: c, rng: rand.New(rand.NewPCG(seed, 1))}
}

func (c *chaosConn) intn(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.IntN(n)
}

func (c *chaosConn) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1+c.intn(min(len(p), 3000))]
	}
	return c.Conn.Read(p)
}

func (c *chaosConn) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		n := min(len(p), 1+c.intn(5000))
		if c.intn(50) == 0 {
			time.Sleep(time.Duration(c.intn(200)) * time.Microsecond)
		}
		k, err := c.Conn.Write(p[:n])
		total += k
		if err != nil {
			return total, err
		}
		p = p[n:]
	}
	return total, nil
}

// TestChaoticConn moves exact bytes both ways on several streams over
// connections that read and write in random short pieces.
func TestChaoticConn(t *testing.T) {
	cn, sn := connPair(t, false)
	srv := &Server{Handler: echoHandler}
	served := runAsync(func() error { return srv.ServeConn(context.Background(), newChaosConn(sn, 1)) })
	cc, err := NewClientConn(context.Background(), newChaosConn(cn, 2), Config{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := cc.Connect(context.Background(), "a:1", nil)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			want := payload(uint64(40+i), 1<<20+i*1000)
			errs <- echoExchange(s, want, uint64(i), 70<<10)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	cc.Close()
	if err := <-served; err != nil {
		t.Errorf("ServeConn = %v", err)
	}
}
