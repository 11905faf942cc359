package proxy

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestShedKeepsTheSpareWhileNothingIsQueued: shedding frees the spare
// descriptor's slot only while a connection waits to be reset, so that no
// other goroutine can take it while the loop merely waits (TESTPLAN F21).
// What is queued is reset, all of it, and the spare is held again after.
func TestShedKeepsTheSpareWhileNothingIsQueued(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var g acceptGuard
	g.reacquire()
	defer g.closeSpare()
	spare := g.spare
	if spare == nil {
		t.Fatal("no spare descriptor after reacquire")
	}
	for range 3 {
		if n := g.shedQueued(l); n != 0 {
			t.Fatalf("shed %d connections from an empty queue", n)
		}
	}
	if g.spare != spare {
		t.Fatalf("shedding an empty queue gave the spare descriptor up (now %v, was %v)", g.spare, spare)
	}

	const queuedConns = 5
	var clients []net.Conn
	for range queuedConns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	// The handshakes are complete when Dial returns: all are queued.
	if n := g.shedQueued(l); n != queuedConns {
		t.Fatalf("shed %d connections of %d queued", n, queuedConns)
	}
	if g.spare == nil {
		t.Fatal("no spare descriptor after shedding")
	}
	for i, c := range clients {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("queued connection %d read %v after the shed, want a reset", i, err)
		}
	}
	if n := g.shedQueued(l); n != 0 {
		t.Errorf("shed %d connections after the queue was drained", n)
	}
}
