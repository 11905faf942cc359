package relay_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/sockwait"
)

// parkIP is the loopback address the Poller tests listen on.
var parkIP = net.IPv4(127, 95, 16, 1)

// pairOn returns both ends of a new connection to ln.
func pairOn(t testing.TB, ln *net.TCPListener) (dialed, accepted *net.TCPConn) {
	t.Helper()
	d, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	a, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return d, a
}

func listenPark(t testing.TB) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: parkIP})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// parkedRelay is client ⇄ [a (TCP) relay b (pushConn)] ⇄ server, started by
// a Poller: the direction from a is the one that parks.
type parkedRelay struct {
	client, server *net.TCPConn
	a              *net.TCPConn
	b              *pushConn
	poller         *relay.Poller
	calls          atomic.Int32
	done           chan copyOutcome
}

func startParked(t *testing.T, poller *relay.Poller) *parkedRelay {
	t.Helper()
	ln := listenPark(t)
	r := &parkedRelay{poller: poller, done: make(chan copyOutcome, 2)}
	r.client, r.a = pairOn(t, ln)
	var bTCP *net.TCPConn
	bTCP, r.server = pairOn(t, ln)
	r.b = newPushConn(bTCP, 7)
	poller.Start(r.a, r.b, nil, nil, func(res relay.Result, err error) {
		r.calls.Add(1)
		r.done <- copyOutcome{res, err}
	})
	t.Cleanup(func() {
		r.client.Close()
		r.server.Close()
		poller.CloseConn(r.a)
		r.b.Close()
		r.wait(t)
	})
	return r
}

// wait returns the copy's outcome, and fails the test if done is called
// again.
func (r *parkedRelay) wait(t *testing.T) copyOutcome {
	t.Helper()
	select {
	case out := <-r.done:
		r.done <- out // for the cleanup's wait
		if n := r.calls.Load(); n != 1 {
			t.Errorf("done called %d times", n)
		}
		return out
	case <-time.After(testTimeout):
		t.Fatal("the copy did not end")
		return copyOutcome{}
	}
}

// endCleanly half-closes the client's side, then the server's, requires
// each FIN to arrive as EOF at the other end, and requires the copy to
// end with want and no error.
func (r *parkedRelay) endCleanly(t *testing.T, want relay.Result) {
	t.Helper()
	r.client.CloseWrite()
	readEOF(t, r.server)
	r.server.CloseWrite()
	readEOF(t, r.client)
	if out := r.wait(t); out.res != want || out.err != nil {
		t.Errorf("done(%+v, %v), want done(%+v, nil)", out.res, out.err, want)
	}
}

// waitParked waits until n connections are parked in p.
func waitParked(t *testing.T, p *relay.Poller, n int) {
	t.Helper()
	waitUntil(t, func() bool { return p.Parked() == n }, fmt.Sprintf("%d parked connections", n))
}

// pullGoroutines counts the goroutines running or waiting in a pulled
// direction's turn.
func pullGoroutines() int {
	buf := make([]byte, 8<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "relay.(*half).pull(")
}

// exchange writes p on w and checks that r reads exactly p.
func exchange(t *testing.T, w, r net.Conn, p []byte) {
	t.Helper()
	werr := make(chan error, 1)
	go func() { _, err := w.Write(p); werr <- err }()
	got := make([]byte, len(p))
	r.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read %d bytes: %v", len(p), err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, p) {
		t.Fatalf("%d bytes arrived altered", len(p))
	}
}

// TestPollerParksAndWakes sends random chunks both ways, each after the
// connection went idle and parked, and checks every byte, that an idle
// connection has no goroutine in its pulled direction, and the result.
func TestPollerParksAndWakes(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	r := startParked(t, p)
	rng := mrand.New(mrand.NewPCG(1, 2))
	var up, down int64
	for i := range 24 {
		if i%3 != 2 { // and sometimes straight after the previous chunk
			waitParked(t, p, 1)
			if n := pullGoroutines(); n != 0 {
				t.Fatalf("round %d: parked, but %d goroutines run the pulled direction", i, n)
			}
		}
		chunk := make([]byte, 1+rng.IntN(200_000))
		for j := range chunk {
			chunk[j] = byte(rng.Uint32())
		}
		if rng.IntN(2) == 0 {
			exchange(t, r.client, r.server, chunk)
			up += int64(len(chunk))
		} else {
			exchange(t, r.server, r.client, chunk)
			down += int64(len(chunk))
		}
	}
	waitParked(t, p, 1)
	r.client.CloseWrite()
	r.server.CloseWrite()
	for _, c := range []net.Conn{r.client, r.server} {
		c.SetReadDeadline(time.Now().Add(testTimeout))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("read after the half-closes = %d, %v; want EOF", n, err)
		}
	}
	out := r.wait(t)
	if want := (relay.Result{AToB: up, BToA: down}); out.res != want || out.err != nil {
		t.Errorf("done(%+v, %v), want done(%+v, nil)", out.res, out.err, want)
	}
}

// TestPollerHalfClose half-closes each side while the pulled direction is
// parked; the other direction keeps flowing until it ends too.
func TestPollerHalfClose(t *testing.T) {
	for _, clientFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("client-first=%v", clientFirst), func(t *testing.T) {
			p := relay.NewPoller(nil)
			defer p.Close()
			r := startParked(t, p)
			exchange(t, r.client, r.server, []byte("request"))
			exchange(t, r.server, r.client, []byte("response"))
			first, firstPeer, second, secondPeer := r.client, r.server, r.server, r.client
			if !clientFirst {
				first, firstPeer, second, secondPeer = r.server, r.client, r.client, r.server
			}
			waitParked(t, p, 1)
			first.CloseWrite()
			readEOF(t, firstPeer)
			if !clientFirst {
				// The pulled direction is still parked.
				waitParked(t, p, 1)
			}
			late := bytes.Repeat([]byte("late"), 50_000)
			exchange(t, second, secondPeer, late)
			second.CloseWrite()
			readEOF(t, secondPeer)
			out := r.wait(t)
			want := relay.Result{AToB: 7, BToA: 8}
			if clientFirst {
				want.BToA += int64(len(late))
			} else {
				want.AToB += int64(len(late))
			}
			if out.res != want || out.err != nil {
				t.Errorf("done(%+v, %v), want done(%+v, nil)", out.res, out.err, want)
			}
		})
	}
}

func readEOF(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(testTimeout))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read = %d, %v; want EOF", n, err)
	}
}

// TestPollerReset resets either application end while the pulled direction
// is parked: the copy ends without an error, and a client whose far side
// was reset reads a reset.
func TestPollerReset(t *testing.T) {
	for _, resetClient := range []bool{true, false} {
		t.Run(fmt.Sprintf("reset-client=%v", resetClient), func(t *testing.T) {
			p := relay.NewPoller(nil)
			defer p.Close()
			r := startParked(t, p)
			exchange(t, r.client, r.server, []byte("x"))
			waitParked(t, p, 1)
			victim, survivor := r.client, r.server
			if !resetClient {
				victim, survivor = r.server, r.client
			}
			victim.SetLinger(0)
			victim.Close()
			out := r.wait(t)
			if out.err != nil || out.res.AToB != 1 || out.res.BToA != 0 {
				t.Errorf("done(%+v, %v), want done({AToB:1}, nil)", out.res, out.err)
			}
			survivor.SetReadDeadline(time.Now().Add(testTimeout))
			_, err := survivor.Read(make([]byte, 1))
			switch {
			case !resetClient && !errors.Is(err, syscall.ECONNRESET):
				// The relay aborted the parked client leg: SO_LINGER 0.
				t.Errorf("client read %v after the server's reset, want ECONNRESET", err)
			case err == nil:
				t.Errorf("server read a byte after the client's reset")
			}
		})
	}
}

// TestPollerCloseConnWhileParked closes the parked leg as a policy teardown
// does (SO_LINGER 0, through the Poller): the copy ends once, with the
// bytes copied before, and the client reads a reset.
func TestPollerCloseConnWhileParked(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	r := startParked(t, p)
	exchange(t, r.client, r.server, []byte("abc"))
	exchange(t, r.server, r.client, []byte("de"))
	waitParked(t, p, 1)
	r.a.SetLinger(0)
	if err := p.CloseConn(r.a); err != nil {
		t.Fatalf("CloseConn: %v", err)
	}
	out := r.wait(t)
	if want := (relay.Result{AToB: 3, BToA: 2}); out.res != want || out.err != nil {
		t.Errorf("done(%+v, %v), want done(%+v, nil)", out.res, out.err, want)
	}
	if got := p.Parked(); got != 0 {
		t.Errorf("%d connections still parked", got)
	}
	r.client.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := r.client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client read %v, want ECONNRESET", err)
	}
	readEOF(t, r.server) // the push leg was closed
}

// TestPollerClose: a Poller that closes hands its parked connections back
// to goroutines, which go on copying.
func TestPollerClose(t *testing.T) {
	p := relay.NewPoller(nil)
	r := startParked(t, p)
	exchange(t, r.client, r.server, []byte("before"))
	waitParked(t, p, 1)
	p.Close()
	if got := p.Parked(); got != 0 {
		t.Errorf("%d connections parked in a closed Poller", got)
	}
	exchange(t, r.client, r.server, []byte("after"))
	r.endCleanly(t, relay.Result{AToB: 11})
}

// TestPollerAfterTheDescriptorLimit: a Poller that cannot make its epoll
// set, because the process has no descriptor left, leaves the connection on
// its goroutine, and parks it once descriptors are free again: a failure at
// the limit is not for the process's life.
func TestPollerAfterTheDescriptorLimit(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	restore := proctest.LeaveDescriptors(t, 5) // startParked's listener and four sockets
	r := startParked(t, p)
	if !proctest.NoneLeft() {
		restore()
		t.Fatal("a descriptor is left: the test set nothing up")
	}
	exchange(t, r.client, r.server, []byte("at the limit"))
	waitUntil(t, func() bool { return relay.ParkErrsForTest(p) > 0 }, "a park failed for want of an epoll set")
	restore()
	if n := p.Parked(); n != 0 {
		t.Fatalf("%d connections parked without an epoll set", n)
	}
	exchange(t, r.client, r.server, []byte("below it"))
	waitParked(t, p, 1)
	exchange(t, r.server, r.client, []byte("and back"))
	r.endCleanly(t, relay.Result{AToB: 20, BToA: 8})
}

// TestPollerDescriptorReuse closes a parked socket behind the Poller's back,
// so that its descriptor number goes to a new socket, which parks in the
// same Poller. Taking the old connection out of the Poller afterwards must
// not touch the new socket's registration: the new connection still wakes.
func TestPollerDescriptorReuse(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	old := startParked(t, p)
	exchange(t, old.client, old.server, []byte("x"))
	waitParked(t, p, 1)
	ln := listenPark(t) // before the close, so that it does not take the number
	fd := relay.FDOf(old.a)
	old.a.Close() // not through p: the socket leaves the epoll set, its parker stays

	// Find a new socket with the same descriptor number and relay it.
	var client, a *net.TCPConn
	for range 20 {
		d, acc := pairOn(t, ln)
		switch fd {
		case relay.FDOf(acc):
			client, a = d, acc
		case relay.FDOf(d):
			client, a = acc, d
		default:
			defer d.Close()
			defer acc.Close()
			continue
		}
		break
	}
	if a == nil {
		t.Fatalf("descriptor %d was not reused", fd)
	}
	defer client.Close()
	b := newIdlePushConn()
	defer b.Close()
	done := make(chan struct{})
	p.Start(a, b, nil, nil, func(relay.Result, error) { close(done) })
	defer func() { p.CloseConn(a); <-done }()
	waitParked(t, p, 2)

	// The stale parker goes (its copy ends); the new one must stay armed.
	p.CloseConn(old.a)
	if out := old.wait(t); out.err != nil {
		t.Errorf("old copy: %v", out.err)
	}
	waitParked(t, p, 1)
	if _, err := client.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.n == 3
	}, "the new connection's bytes")
}

// TestPollerManyIdle parks 2,000 connections at once: the goroutine count
// stays flat in the number of idle connections, each wakes and parks again
// when a byte comes, and each copy ends exactly once.
func TestPollerManyIdle(t *testing.T) {
	const n = 2000
	p := relay.NewPoller(nil)
	defer p.Close()
	ln := listenPark(t)
	base := runtime.NumGoroutine()
	type conn struct {
		client, a *net.TCPConn
		b         *idlePushConn
		calls     atomic.Int32
	}
	conns := make([]*conn, n)
	var ended sync.WaitGroup
	for i := range conns {
		c := &conn{b: newIdlePushConn()}
		c.client, c.a = pairOn(t, ln)
		conns[i] = c
		ended.Add(1)
		p.Start(c.a, c.b, nil, nil, func(relay.Result, error) {
			c.calls.Add(1)
			ended.Done()
		})
	}
	defer func() {
		for _, c := range conns {
			c.client.Close()
			p.CloseConn(c.a)
			c.b.Close()
		}
	}()
	checkFlat := func(what string) {
		t.Helper()
		waitParked(t, p, n)
		// The Poller's goroutine, and a few the runtime or the test may
		// have: nothing per connection.
		if g := runtime.NumGoroutine() - base; g > 20 {
			t.Fatalf("%s: %d goroutines more than before %d idle connections", what, g, n)
		}
	}
	checkFlat("started")
	for _, c := range conns {
		if _, err := c.client.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		waitUntil(t, func() bool {
			c.b.mu.Lock()
			defer c.b.mu.Unlock()
			return c.b.n == 1
		}, "a byte through each connection")
	}
	checkFlat("after a byte each")

	// End half of them by a teardown through the Poller, half by the
	// clients' FIN and the push's end.
	for i, c := range conns {
		if i%2 == 0 {
			p.CloseConn(c.a)
		} else {
			c.client.CloseWrite()
			c.b.Close()
		}
	}
	ended.Wait()
	if got := p.Parked(); got != 0 {
		t.Errorf("%d connections parked after every copy ended", got)
	}
	waitUntil(t, func() bool { return runtime.NumGoroutine() <= base+1 }, "the copies' goroutines to exit")
	for i, c := range conns {
		if k := c.calls.Load(); k != 1 {
			t.Fatalf("connection %d: done called %d times", i, k)
		}
	}
}

// TestPollerCloseWhileParking closes the pulled leg through the Poller at
// random moments around the end of a burst, when the direction is copying,
// waiting briefly, parking or parked: whichever it is doing, the copy ends,
// once.
func TestPollerCloseWhileParking(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	ln := listenPark(t)
	rng := mrand.New(mrand.NewPCG(5, 6))
	for i := range 150 {
		client, a := pairOn(t, ln)
		b := newIdlePushConn()
		var calls atomic.Int32
		done := make(chan struct{})
		p.Start(a, b, nil, nil, func(relay.Result, error) {
			if calls.Add(1) == 1 {
				close(done)
			}
		})
		if _, err := client.Write(make([]byte, 1+rng.IntN(4096))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(2 * relay.IdleRespawn))))
		a.SetLinger(0)
		p.CloseConn(a)
		select {
		case <-done:
		case <-time.After(testTimeout):
			t.Fatalf("iteration %d: the copy did not end after its socket was closed", i)
		}
		client.Close()
		b.Close()
		if n := calls.Load(); n != 1 {
			t.Fatalf("iteration %d: done called %d times", i, n)
		}
	}
	if n := p.Parked(); n != 0 {
		t.Errorf("%d connections parked at the end", n)
	}
}

// TestPollerCloseRacingPark widens the window between a close's look at the
// Poller and the close itself, while the direction has just copied a burst
// and is about to park: the direction must not park a socket that is being
// closed (it would then never wake), so the copy ends.
func TestPollerCloseRacingPark(t *testing.T) {
	p := relay.NewPoller(nil)
	defer p.Close()
	ln := listenPark(t)
	client, a := pairOn(t, ln)
	defer client.Close()
	b := newIdlePushConn()
	defer b.Close()
	done := make(chan struct{})
	p.Start(a, b, nil, nil, func(relay.Result, error) { close(done) })
	if _, err := client.Write([]byte("burst")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.n == 5
	}, "the burst")
	// The direction now waits up to IdleRespawn, then parks: let it try
	// while the close is under way.
	relay.SetBeforeCloseForTest(p, func() { time.Sleep(3 * relay.IdleRespawn) })
	p.CloseConn(a)
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the copy did not end: its socket was parked while being closed")
	}
}

// TestPollerPrivateSet: a Poller given no Set makes its own and parks in
// it; its Close hands the parked connection back to a goroutine.
func TestPollerPrivateSet(t *testing.T) {
	p := relay.NewPoller(nil)
	r := startParked(t, p)
	for i := range 3 {
		exchange(t, r.client, r.server, []byte{byte(i)})
		waitParked(t, p, 1)
		if n := pullGoroutines(); n != 0 {
			t.Fatalf("round %d: parked, but %d goroutines run the pulled direction", i, n)
		}
	}
	p.Close()
	exchange(t, r.client, r.server, []byte("after"))
	r.endCleanly(t, relay.Result{AToB: 8})
}

// TestPollersShareASet: two Pollers parking in one Set (a node's pods)
// count their own connections only, and closing one hands its connections
// back without touching the other's, which stay parked, wake on data and
// park again in the Set, still open.
func TestPollersShareASet(t *testing.T) {
	set := sockwait.New()
	defer set.Close()
	p1, p2 := relay.NewPoller(set), relay.NewPoller(set)
	defer p2.Close()
	r1a, r1b := startParked(t, p1), startParked(t, p1)
	r2 := startParked(t, p2)
	for _, r := range []*parkedRelay{r1a, r1b, r2} {
		exchange(t, r.client, r.server, []byte("x"))
	}
	waitParked(t, p1, 2)
	waitParked(t, p2, 1)
	if n := set.Parked(); n != 3 {
		t.Fatalf("the Set holds %d parked sockets, want 3", n)
	}

	p1.Close()
	if n := p1.Parked(); n != 0 {
		t.Errorf("%d connections parked in the closed Poller", n)
	}
	time.Sleep(2 * relay.IdleRespawn) // time to disturb p2's, if anything did
	if n := p2.Parked(); n != 1 {
		t.Fatalf("the other Poller has %d parked connections after the close, want 1", n)
	}
	if n := set.Parked(); n != 1 {
		t.Fatalf("the Set holds %d parked sockets after one Poller closed, want 1", n)
	}
	for round := range 3 {
		exchange(t, r2.client, r2.server, []byte("yz"))
		exchange(t, r2.server, r2.client, []byte{byte(round)})
		waitParked(t, p2, 1)
	}

	// p1's connections went back to goroutines and still copy.
	for _, r := range []*parkedRelay{r1a, r1b} {
		exchange(t, r.client, r.server, []byte("after"))
		r.endCleanly(t, relay.Result{AToB: 6})
	}
	r2.endCleanly(t, relay.Result{AToB: 7, BToA: 3})
}

// TestPollerSharedSetCloses: when its shared Set closes (the process
// stops), a Poller's parked connections go back to goroutines and keep
// copying, without parking again.
func TestPollerSharedSetCloses(t *testing.T) {
	set := sockwait.New()
	p := relay.NewPoller(set)
	defer p.Close()
	r := startParked(t, p)
	exchange(t, r.client, r.server, []byte("before"))
	waitParked(t, p, 1)
	set.Close()
	waitParked(t, p, 0)
	exchange(t, r.client, r.server, []byte("after"))
	time.Sleep(2 * relay.IdleRespawn) // past the wait before a park
	if n := p.Parked(); n != 0 {
		t.Errorf("%d connections parked in a closed Set", n)
	}
	exchange(t, r.server, r.client, []byte("back"))
	r.endCleanly(t, relay.Result{AToB: 11, BToA: 4})
}
