package sockwait_test

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/sockwait"
)

// quiet is how long a test waits to see that a wake did not run.
const quiet = 50 * time.Millisecond

func listen(t *testing.T) (*net.TCPListener, syscall.RawConn) {
	t.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	rc, err := l.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return l, rc
}

func dial(t *testing.T, l net.Listener) {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
}

// parked returns the Watch of rc in s, parked with wake.
func parked(t *testing.T, s *sockwait.Set, rc syscall.RawConn, wake func()) *sockwait.Watch {
	t.Helper()
	w := s.Watch(rc)
	if !w.Park(wake) {
		t.Fatal("Park = false")
	}
	return w
}

func newSet(t *testing.T) *sockwait.Set {
	s := sockwait.New()
	t.Cleanup(func() { s.Close() })
	return s
}

// waker returns a wake function and the channel it signals.
func waker() (func(), chan struct{}) {
	ch := make(chan struct{}, 4)
	return func() { ch <- struct{}{} }, ch
}

func woken(t *testing.T, ch chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("wake did not run")
	}
}

func notWoken(t *testing.T, ch chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal("wake ran")
	case <-time.After(quiet):
	}
}

func TestParkWakesOnConnection(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	wake, ch := waker()
	parked(t, s, rc, wake)
	notWoken(t, ch)
	if got := s.Parked(); got != 1 {
		t.Fatalf("Parked = %d, want 1", got)
	}
	dial(t, l)
	woken(t, ch)
	if got := s.Parked(); got != 0 {
		t.Fatalf("Parked after the wake = %d, want 0", got)
	}
	// One event per Park: the connection still waiting to be accepted
	// wakes nobody else.
	notWoken(t, ch)
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
}

func TestReadinessBeforeParkIsNotLost(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	dial(t, l)
	wake, ch := waker()
	if !s.Watch(rc).Park(wake) {
		t.Fatal("Park = false")
	}
	woken(t, ch)
}

func TestReparkWakesAgain(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	w := s.Watch(rc)
	wake, ch := waker()
	for i := range 3 {
		if !w.Park(wake) {
			t.Fatalf("Park %d = false", i)
		}
		if w.Park(wake) {
			t.Fatalf("a second Park %d while one is pending = true", i)
		}
		dial(t, l)
		woken(t, ch)
		if _, err := l.Accept(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUnparkPendingWakesNobody(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	wake, ch := waker()
	w := parked(t, s, rc, wake)
	if !w.Unpark() {
		t.Fatal("Unpark of a pending Park = false")
	}
	dial(t, l)
	notWoken(t, ch)
	if w.Park(wake) {
		t.Fatal("Park after Unpark = true")
	}
	if w.Unpark() {
		t.Fatal("a second Unpark = true")
	}
}

func TestUnparkAfterWake(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	wake, ch := waker()
	w := parked(t, s, rc, wake)
	dial(t, l)
	woken(t, ch)
	if w.Unpark() {
		t.Fatal("Unpark after the wake started = true")
	}
}

func TestUnparkNeverParked(t *testing.T) {
	_, rc := listen(t)
	if newSet(t).Watch(rc).Unpark() {
		t.Fatal("Unpark of a watch never parked = true")
	}
}

func TestParkClosedSocket(t *testing.T) {
	s := newSet(t)
	l, rc := listen(t)
	l.Close()
	wake, _ := waker()
	if s.Watch(rc).Park(wake) {
		t.Fatal("Park of a closed socket = true")
	}
}

func TestNilSetParksNothing(t *testing.T) {
	var s *sockwait.Set
	_, rc := listen(t)
	w := s.Watch(rc)
	if w.Park(func() { t.Error("wake ran") }) {
		t.Fatal("Park on a nil Set = true")
	}
	if w.Unpark() {
		t.Fatal("Unpark on a nil Set = true")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseHandsPendingWakesBack(t *testing.T) {
	s := sockwait.New()
	_, rc := listen(t)
	wake, ch := waker()
	w := parked(t, s, rc, wake)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	woken(t, ch)
	if w.Park(wake) {
		t.Fatal("Park after Close = true")
	}
}

func TestDatagramWakes(t *testing.T) {
	s := newSet(t)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rc, err := pc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	wake, ch := waker()
	if !s.Watch(rc).Park(wake) {
		t.Fatal("Park = false")
	}
	notWoken(t, ch)
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	woken(t, ch)
}

// TestManySocketsOneGoroutine parks more sockets than one epoll_wait
// returns, wakes them all, and counts the Set's goroutines: one.
func TestManySocketsOneGoroutine(t *testing.T) {
	s := newSet(t)
	const n = 150
	ch := make(chan int, n)
	ls := make([]*net.TCPListener, n)
	for i := range ls {
		l, rc := listen(t)
		ls[i] = l
		if !s.Watch(rc).Park(func() { ch <- i }) {
			t.Fatalf("Park %d = false", i)
		}
	}
	waitLoops(t, s, 1)
	for _, l := range ls {
		dial(t, l)
	}
	seen := make(map[int]bool)
	for range n {
		select {
		case i := <-ch:
			if seen[i] {
				t.Fatalf("socket %d woken twice", i)
			}
			seen[i] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d woken", len(seen), n)
		}
	}
}

// waitLoops waits up to 5 s for loops(s) to be n: a goroutine just started
// may not show in a stack dump yet.
func waitLoops(t *testing.T, s *sockwait.Set, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); loops(s) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines in s's loop, want %d", loops(s), n)
		}
	}
}

// loops counts the goroutines running s's loop.
func loops(s *sockwait.Set) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), fmt.Sprintf("sockwait.(*Set).loop(%p", s))
}

// TestSlotReuseDropsStaleEvents unparks a watch and parks another socket
// in its slot; the old socket's readiness must not wake the new one.
func TestSlotReuseDropsStaleEvents(t *testing.T) {
	s := newSet(t)
	l1, rc1 := listen(t)
	l2, rc2 := listen(t)
	w1 := s.Watch(rc1)
	wake1, ch1 := waker()
	if !w1.Park(wake1) {
		t.Fatal("Park 1 = false")
	}
	if !w1.Unpark() {
		t.Fatal("Unpark 1 = false")
	}
	wake2, ch2 := waker()
	if !s.Watch(rc2).Park(wake2) {
		t.Fatal("Park 2 = false")
	}
	dial(t, l1)
	notWoken(t, ch1)
	notWoken(t, ch2)
	dial(t, l2)
	woken(t, ch2)
}

// TestRetiresWhenNothingIsWatched: once every watch is unparked the Set's
// goroutine ends; the next Park starts it again and still wakes.
func TestRetiresWhenNothingIsWatched(t *testing.T) {
	s := newSet(t)
	_, rc1 := listen(t)
	l2, rc2 := listen(t)
	w1, w2 := s.Watch(rc1), s.Watch(rc2)
	wake, ch := waker()
	if !w1.Park(wake) || !w2.Park(wake) {
		t.Fatal("Park = false")
	}
	waitLoops(t, s, 1)
	w1.Unpark()
	if got := loops(s); got != 1 {
		t.Fatalf("%d loops with one watch left, want 1", got)
	}
	w2.Unpark()
	waitLoops(t, s, 0)
	w3 := s.Watch(rc2)
	if !w3.Park(wake) {
		t.Fatal("Park after the retirement = false")
	}
	dial(t, l2)
	woken(t, ch)
}
