package proxy

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestShedKeepsTheSpareWhileNothingIsQueued: shedding frees the spare
// descriptor's slot only while a connection waits to be reset, so that no
// other goroutine can take it while the loop merely waits (TESTPLAN F21).
// What is queued is reset, all of it, and the spare is held again after.
func TestShedKeepsTheSpareWhileNothingIsQueued(t *testing.T) {
	l, g := guardedListener(t)
	spare := g.spare
	for range 3 {
		if n := g.shedQueued(l); n != 0 {
			t.Fatalf("shed %d connections from an empty queue", n)
		}
	}
	if g.spare != spare {
		t.Fatalf("shedding an empty queue gave the spare descriptor up (now %v, was %v)", g.spare, spare)
	}

	const queuedConns = 5
	clients := queueClients(t, l, queuedConns)
	if n := g.shedQueued(l); n != queuedConns {
		t.Fatalf("shed %d connections of %d queued", n, queuedConns)
	}
	if g.spare == nil {
		t.Fatal("no spare descriptor after shedding")
	}
	wantResets(t, clients)
	if n := g.shedQueued(l); n != 0 {
		t.Errorf("shed %d connections after the queue was drained", n)
	}
}

// TestShedRetakesTheSpareAfterABriefReservation: after a shed, the open
// that takes the spare back can fail for a moment, while another
// goroutine's failing accept4 or socket(2) holds the freed slot; the shed
// tries it again rather than losing the spare.
func TestShedRetakesTheSpareAfterABriefReservation(t *testing.T) {
	l, g := guardedListener(t)
	saved := openSpareFile
	defer func() { openSpareFile = saved }()
	opens := 0
	openSpareFile = func() (*os.File, error) {
		if opens++; opens <= 2 { // the slot held by another call, twice
			return nil, syscall.EMFILE
		}
		return saved()
	}
	clients := queueClients(t, l, 2)
	if n := g.shedQueued(l); n != 2 {
		t.Fatalf("shed %d connections of 2 queued", n)
	}
	wantResets(t, clients)
	if g.spare == nil {
		t.Fatalf("the spare was lost after %d opens, two of them refused", opens)
	}
	if opens != 3 {
		t.Errorf("the spare was opened %d times after the shed, want 3 (two refused, then held)", opens)
	}
}

// TestShedWithoutTheSpareResetsTheQueue: with the spare lost and no
// descriptor to accept with, what is queued is reset all the same, and the
// listener goes on listening on its address, a port-0 one included.
func TestShedWithoutTheSpareResetsTheQueue(t *testing.T) {
	fixed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fixedAddr := fixed.Addr().String()
	fixed.Close()
	for _, addr := range []string{"127.0.0.1:0", fixedAddr} {
		t.Run(addr, func(t *testing.T) {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			before := l.Addr().String()
			saved := openSpareFile
			openSpareFile = func() (*os.File, error) { return nil, syscall.EMFILE }
			defer func() { openSpareFile = saved }()
			var g acceptGuard
			const queuedConns = 3
			clients := queueClients(t, l, queuedConns)
			if n := g.shedQueued(l); n != queuedConns {
				t.Fatalf("shed %d connections of %d queued, without a spare", n, queuedConns)
			}
			wantResets(t, clients)
			if got := l.Addr().String(); got != before {
				t.Fatalf("listener moved from %s to %s", before, got)
			}
			c, err := net.Dial("tcp", before)
			if err != nil {
				t.Fatalf("dial %s after the reset: %v", before, err)
			}
			defer c.Close()
			_ = l.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
			s, err := l.Accept()
			if err != nil {
				t.Fatalf("accept after the reset: %v", err)
			}
			s.Close()
		})
	}
}

// guardedListener returns a loopback listener and an acceptGuard holding
// its spare descriptor, both closed when t ends.
func guardedListener(t *testing.T) (net.Listener, *acceptGuard) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := new(acceptGuard)
	g.reacquire()
	t.Cleanup(g.closeSpare)
	if g.spare == nil {
		t.Fatal("no spare descriptor after reacquire")
	}
	return l, g
}

// queueClients dials l n times and waits until all n are in its accept
// queue (a client's Dial can return before the listener has taken its
// last ACK, when softirqs run on their own thread).
func queueClients(t *testing.T, l net.Listener, n int) []net.Conn {
	t.Helper()
	var clients []net.Conn
	for range n {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	rc, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		waiting, ok := 0, false
		if err := rc.Control(func(fd uintptr) { waiting, _, ok = acceptQueue(int(fd)) }); err != nil || !ok {
			t.Fatalf("accept queue of %v unreadable: %v", l.Addr(), err)
		}
		if waiting >= n {
			return clients
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("accept queue holds %d connections 5s after %d dials", waiting, n)
		}
	}
}

// wantResets checks that each of clients reads a reset.
func wantResets(t *testing.T, clients []net.Conn) {
	t.Helper()
	for i, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("queued connection %d read %v after the shed, want a reset", i, err)
		}
	}
}

// TestSpareDescriptor: the spare is /dev/null (a character device, 1:3),
// close-on-exec, so that it never leaks into a child process. (Whether
// Close frees the slot is not asked here: another test's goroutine may take
// the number at once.)
func TestSpareDescriptor(t *testing.T) {
	f, err := openSpareFile()
	if err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 1<<8|3 {
		t.Errorf("spare descriptor: mode %#o rdev %#x, want /dev/null (character device 1:3)", st.Mode, st.Rdev)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Error("spare descriptor is not close-on-exec")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
