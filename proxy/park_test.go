package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/sockwait"
)

// acceptorLoops counts the goroutines running an acceptor's loop.
func acceptorLoops() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "proxy.(*acceptor).loop(")
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// served dials addr, sends a line no listener takes (not a TLS hello, not
// SOCKS5, and a bare dial has no route) and checks that the proxy accepted
// the connection and ended it: a read that ends, rather than waits, as it
// would in an accept queue nobody takes from.
func served(t *testing.T, addr net.Addr) {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	if errors.Is(err, syscall.ECONNRESET) {
		return // accepted and reset before the dial returned
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("GET / HTTP/1.0\r\n\r\n")) // a reset already is an accept
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection to %v was never accepted", addr)
	}
}

func shortAcceptIdle(t *testing.T, d time.Duration) {
	old := acceptIdle
	acceptIdle = d
	t.Cleanup(func() { acceptIdle = old })
}

// TestParkedListeners: with Config.Sockets, Start leaves every listener
// parked with no goroutine; a connection wakes its listener's loop, which
// accepts it and parks again once idle; Shutdown ends parked listeners.
func TestParkedListeners(t *testing.T) {
	shortAcceptIdle(t, 30*time.Millisecond)
	set := sockwait.New()
	defer set.Close()
	before := acceptorLoops()
	p, _ := listenWithDNS(t, "127.88.252.6", func(c *Config) { c.Sockets = set })
	addrs := p.Addrs()
	p.Start()
	if got := acceptorLoops() - before; got != 0 {
		t.Errorf("%d accept loops on goroutines after Start, want 0", got)
	}
	// And the DNS proxy's UDP and TCP sockets.
	parked := len(addrs) + 2
	if got := set.Parked(); got != parked {
		t.Errorf("%d sockets parked after Start, want %d", got, parked)
	}
	for name, addr := range addrs {
		served(t, addr)
		// The loop parks again once idle for acceptIdle.
		waitFor(t, name+"'s loop to park again", func() bool {
			return acceptorLoops() == before && set.Parked() == parked
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := set.Parked(); got != 0 {
		t.Errorf("%d listeners still parked after Shutdown", got)
	}
	if got := acceptorLoops(); got != before {
		t.Errorf("%d accept loops after Shutdown, %d before", got, before)
	}
}

// TestShutdownWhileWoken: Shutdown just after connections woke the loops
// (some running, some parked again, some about to) returns, with every
// loop ended.
func TestShutdownWhileWoken(t *testing.T) {
	shortAcceptIdle(t, time.Millisecond)
	set := sockwait.New()
	defer set.Close()
	before := acceptorLoops()
	for i := range 20 {
		p, _ := listenWithDNS(t, "127.88.252.7", func(c *Config) { c.Sockets = set })
		p.Start()
		for _, addr := range p.Addrs() {
			if c, err := net.Dial("tcp", addr.String()); err == nil {
				defer c.Close()
			}
		}
		if i%2 == 0 {
			time.Sleep(time.Millisecond)
		}
		// The connections wait in their handlers: the drain ends at once
		// and closes them.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		err := p.Shutdown(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got := acceptorLoops(); got != before {
			t.Fatalf("round %d: %d accept loops after Shutdown, %d before", i, got, before)
		}
	}
	if got := set.Parked(); got != 0 {
		t.Errorf("%d listeners still parked after every Shutdown", got)
	}
}

// TestClosedSetFallsBack: once the Set is closed, a parked loop goes back
// to a goroutine of its own and still serves.
func TestClosedSetFallsBack(t *testing.T) {
	shortAcceptIdle(t, 10*time.Millisecond)
	set := sockwait.New()
	before := acceptorLoops()
	p, _ := listenWithDNS(t, "127.88.252.8", func(c *Config) { c.Sockets = set })
	defer p.Shutdown(context.Background())
	p.Start()
	set.Close()
	n := len(p.Addrs())
	waitFor(t, "the loops to run on goroutines", func() bool { return acceptorLoops()-before == n })
	time.Sleep(50 * time.Millisecond) // several idle windows: they stay
	if got := acceptorLoops() - before; got != n {
		t.Errorf("%d accept loops on goroutines after the Set closed, want %d", got, n)
	}
	for _, addr := range p.Addrs() {
		served(t, addr)
	}
}
