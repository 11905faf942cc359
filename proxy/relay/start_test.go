package relay_test

import (
	"io"
	"maps"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// idlePushConn is a relay leg whose pushing source never has bytes: PushTo
// keeps done, and Close calls it. Writes to it record which goroutine made
// them. Its Read blocks until Close.
type idlePushConn struct {
	net.Conn // nil: only the methods below are used

	mu          sync.Mutex
	writers     map[int]bool // ids of goroutines that wrote or half-closed
	n           int
	closedWrite bool
	done        func(error)
	isClosed    bool
	closed      chan struct{}
}

func newIdlePushConn() *idlePushConn {
	return &idlePushConn{writers: map[int]bool{}, closed: make(chan struct{})}
}

// goroutineID parses the running goroutine's id from its stack header
// ("goroutine 42 [running]:"); tests only.
func goroutineID() int {
	var buf [64]byte
	f := strings.Fields(string(buf[:runtime.Stack(buf[:], false)]))
	id, _ := strconv.Atoi(f[1])
	return id
}

// alive reports which of ids are goroutines that still exist.
func alive(ids map[int]bool) []int {
	buf := make([]byte, 1<<20)
	dump := string(buf[:runtime.Stack(buf, true)])
	var out []int
	for id := range ids {
		if strings.Contains(dump, "goroutine "+strconv.Itoa(id)+" [") {
			out = append(out, id)
		}
	}
	return out
}

func (c *idlePushConn) Write(p []byte) (int, error) {
	id := goroutineID()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writers[id] = true
	c.n += len(p)
	return len(p), nil
}

func (c *idlePushConn) CloseWrite() error {
	id := goroutineID()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writers[id] = true
	c.closedWrite = true
	return nil
}

func (c *idlePushConn) PushTo(w io.Writer, done func(error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = done
	return nil
}

func (c *idlePushConn) Read(p []byte) (int, error) {
	<-c.closed
	return 0, net.ErrClosed
}

// Close ends the push with net.ErrClosed. It may be called again from done
// (the relay closes both legs when a direction fails), like an HBONE stream.
func (c *idlePushConn) Close() error {
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		return nil
	}
	c.isClosed = true
	close(c.closed)
	done := c.done
	c.mu.Unlock()
	if done != nil {
		done(net.ErrClosed)
	}
	return nil
}

// TestStartPullChain checks what keeps an idle started connection small:
// with a pushing leg opposite a TCP socket, every goroutine that copied a
// burst from the socket (writes through TLS and HTTP/2 framing grow a
// stack) has exited by the time the connection is idle again, so the one
// waiting is fresh; and the bytes, the half-close and the result come out as
// with Copy.
func TestStartPullChain(t *testing.T) {
	client, a := tcpConnPair(t)
	defer client.Close()
	defer a.Close()
	b := newIdlePushConn()
	defer b.Close()
	done := make(chan copyOutcome, 1)
	relay.Start(a, b, nil, nil, func(res relay.Result, err error) { done <- copyOutcome{res, err} })

	const bursts, size = 5, 50_000
	for i := range bursts {
		if _, err := client.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.n == (i+1)*size
		}, "a burst to arrive")
		b.mu.Lock()
		writers := maps.Clone(b.writers)
		b.mu.Unlock()
		waitUntil(t, func() bool { return len(alive(writers)) == 0 }, "the goroutines that copied to exit")
	}
	b.mu.Lock()
	if len(b.writers) < 2 {
		t.Errorf("%d goroutines copied %d bursts; want a new one after each idle wait", len(b.writers), bursts)
	}
	b.mu.Unlock()

	client.CloseWrite()
	waitUntil(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.closedWrite
	}, "the half-close")
	b.Close() // the pushed direction ends
	var out copyOutcome
	select {
	case out = <-done:
	case <-time.After(testTimeout):
		t.Fatal("Start did not call done")
	}
	if want := (relay.Result{AToB: bursts * size}); out.res != want || out.err != nil {
		t.Errorf("done(%+v, %v), want done(%+v, nil)", out.res, out.err, want)
	}
}

// waitUntil polls cond until it holds or testTimeout passes.
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(time.Millisecond) {
		if time.Since(start) > testTimeout {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestStartReturnsAtOnce: Start does not wait for the copy.
func TestStartReturnsAtOnce(t *testing.T) {
	r := startRelayVia(t, legTCP, legPush, viaStart)
	select {
	case out := <-r.done:
		t.Fatalf("copy ended before any traffic: %+v", out)
	case <-time.After(50 * time.Millisecond):
	}
	io.WriteString(r.client, "ping")
	buf := make([]byte, 4)
	r.server.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := io.ReadFull(r.server, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("server read %q, %v; want ping", buf, err)
	}
}

// BenchmarkRoundTrip measures a 1-byte round trip through a relay whose
// client leg is TCP (read with readability waits; with Start, by a chain of
// goroutines) and whose server leg pushes, via Copy and Start.
func BenchmarkRoundTrip(b *testing.B) {
	for _, v := range []via{viaCopy, viaStart} {
		name := "copy"
		if v == viaStart {
			name = "start"
		}
		b.Run(name, func(b *testing.B) {
			r := startRelayVia(b, legTCP, legPush, v)
			go func() {
				var buf [1]byte
				for {
					if _, err := io.ReadFull(r.server, buf[:]); err != nil {
						return
					}
					if _, err := r.server.Write(buf[:]); err != nil {
						return
					}
				}
			}()
			var buf [1]byte
			b.ResetTimer()
			for range b.N {
				if _, err := r.client.Write(buf[:]); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(r.client, buf[:]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
