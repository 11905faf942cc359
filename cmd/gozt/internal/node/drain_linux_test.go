package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/tcptest"
)

// TestSharedModeDrainPassesHalfCloses is SIGTERM's drain in shared mode
// (SPEC §8.4) as a roll of the gozt DaemonSet meets it (the draft of e2e
// scenario 6, e2e/testdata/drafts): connections opened before the drain
// carry every byte and every half-close, either way, while the old gozt
// drains, and at the drain deadline those still open are closed and
// Shutdown returns. "alone" drains the only gozt of the node; "successor"
// drains it after a new gozt has taken the same pods over (both listening
// in each pod's namespace), with connections from the new gozt's outbound
// into the old one's inbound among those that must finish. In both, pod A
// also holds a connection to B on another node, whose gozt keeps running.
func TestSharedModeDrainPassesHalfCloses(t *testing.T) {
	t.Run("alone", func(t *testing.T) { testSharedDrain(t, noSuccessor) })
	t.Run("successor", func(t *testing.T) { testSharedDrain(t, withSuccessor) })
}

// testSharedDrain's successor argument.
const (
	noSuccessor   = false
	withSuccessor = true
)

// drainDeadline is the drain deadline of these tests: long enough for
// every check made during the drain, short enough for a test.
const drainDeadline = 4 * time.Second

// heldConn is a connection from a pod that sent msg and has not
// half-closed: the app's echo of msg waits, unread, in its socket.
type heldConn struct {
	net.Conn
	name, msg string
}

// drainConns are the connections from pod A opened before a drain, by
// what each must do during it.
type drainConns struct {
	held     []heldConn    // each half-closes, to a startEOFTrailerApp app
	finFirst heldConn      // to startFinFirstApp's app, which half-closes first
	fins     <-chan string // what that app read after its FIN
	bulk     heldConn      // carries a megabyte each way, then half-closes
	open     []heldConn    // still open at the deadline
}

func testSharedDrain(t *testing.T, successor bool) {
	m := newMeshNet(t)
	m.node(1)
	m.node(2)
	a, c := m.pod(1, 2, true), m.pod(1, 3, true)
	b := m.pod(2, 2, true)
	for _, p := range []pod{b, c} {
		startApp(t, p, 8080)
		startEOFTrailerApp(t, p, 8082)
	}
	fins := startFinFirstApp(t, c, 8081)
	cp := newControlPlane(t)
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"), meshWorkload("b", b.ip, "node2"))
	old, n2 := cp.startShared(t, "node1"), cp.startShared(t, "node2")
	old.add(t, "uid-a", a, "a")
	old.add(t, "uid-c", c, "c")
	old.snapshotSent(t)
	n2.add(t, "uid-b", b, "b")
	n2.snapshotSent(t)
	for _, n := range []*sharedNode{old, n2} {
		eventually(t, 10*time.Second, n.name+" ready", func() bool { return strings.HasPrefix(n.readiness(t), "ready") })
	}

	dc := drainConns{
		held: []heldConn{
			holdFrom(t, a, c.ip+":8082", "A → C through the old gozt"),
			holdFrom(t, a, b.ip+":8082", "A → B on node2"),
		},
		finFirst: holdFrom(t, a, c.ip+":8081", "A → C, C half-closes first"),
		fins:     fins,
		bulk:     openFrom(t, a, c.ip+":8080", "A → C, bulk"),
		open: []heldConn{
			openFrom(t, a, c.ip+":8080", "A → C, open at the deadline"),
			openFrom(t, a, b.ip+":8080", "A → B, open at the deadline"),
		},
	}
	for _, h := range dc.open {
		if err := ping(h); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
	}
	if successor {
		next := cp.startShared(t, "node1")
		dc.held = append(dc.held, takeOver(t, old, next, a, c)...)
	}

	// Every connection is established end to end before the drain starts:
	// a connection whose HBONE stream is still being set up when the
	// inbound stops accepting is refused (the drain's rule, not a lost
	// byte), and a client's write returning says nothing of that.
	toC, toB := dc.countTo("A → C"), dc.countTo("A → B")
	waitInbound(t, old, "uid-c", toC)
	waitInbound(t, n2, "uid-b", toB)

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), drainDeadline)
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- old.Shutdown(ctx) }()
	time.Sleep(500 * time.Millisecond) // well into the drain: listeners closed, GOAWAYs sent
	dc.checkDuringDrain(t)
	if el := time.Since(start); el > drainDeadline-time.Second {
		t.Fatalf("the checks during the drain took %v, too close to the %v deadline to mean anything", el, drainDeadline)
	}
	dc.checkDeadline(t, start, shutdown)
}

// countTo counts dc's connections whose name starts with prefix.
func (dc drainConns) countTo(prefix string) int {
	n := 0
	for _, h := range slices.Concat(dc.held, dc.open, []heldConn{dc.finFirst, dc.bulk}) {
		if strings.HasPrefix(h.name, prefix) {
			n++
		}
	}
	return n
}

// waitInbound waits until the proxy of pod uid on n lists at least want
// inbound connections: their streams were answered and their upstreams
// dialed.
func waitInbound(t *testing.T, n *sharedNode, uid string, want int) {
	t.Helper()
	eventually(t, 5*time.Second, fmt.Sprintf("%s listing %d inbound connections of %s", n.name, want, uid), func() bool {
		_, running := n.pods.handedOver()
		pp := running[uid]
		if pp == nil {
			return false
		}
		in, _ := pp.p.Connections()
		return len(in) >= want
	})
}

// checkDuringDrain requires every connection to work as its field says.
func (dc drainConns) checkDuringDrain(t *testing.T) {
	t.Helper()
	for _, h := range dc.held {
		if err := h.halfCloseAndDrain(); err != nil {
			t.Errorf("%s, half-closed during the drain: %v", h.name, err)
		}
	}
	if err := checkFinFirst(dc.finFirst, dc.fins); err != nil {
		t.Errorf("%s, during the drain: %v", dc.finFirst.name, err)
	}
	if err := exchange(dc.bulk.Conn, 3, 1<<20); err != nil {
		t.Errorf("%s, during the drain: %v", dc.bulk.name, err)
	}
	for _, h := range dc.open {
		if err := ping(h); err != nil {
			t.Errorf("%s, during the drain: %v", h.name, err)
		}
	}
}

// checkDeadline requires the drain begun at start to end, with shutdown's
// result, at the deadline and not before, and the connections still open
// then to be closed.
func (dc drainConns) checkDeadline(t *testing.T, start time.Time, shutdown <-chan error) {
	t.Helper()
	select {
	case err := <-shutdown:
		el := time.Since(start)
		if err != nil {
			t.Errorf("Shutdown = %v, want nil", err)
		}
		if el < drainDeadline-200*time.Millisecond {
			t.Errorf("Shutdown returned %v into a %v drain, with connections open", el, drainDeadline)
		}
	case <-time.After(drainDeadline + 2*time.Second):
		t.Fatalf("Shutdown still running %v after it began, deadline %v", time.Since(start), drainDeadline)
	}
	for _, h := range dc.open {
		h.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := h.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("%s: read after Shutdown = %v, want it closed", h.name, err)
		}
	}
}

// openFrom connects from pod p to addr; the connection is closed when the
// test ends.
func openFrom(t *testing.T, p pod, addr, name string) heldConn {
	t.Helper()
	conn, err := dialFrom(t, p, addr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	return heldConn{Conn: conn, name: name}
}

// holdFrom connects from pod p to addr and sends a message naming the
// connection, leaving the echo unread and the connection open.
func holdFrom(t *testing.T, p pod, addr, name string) heldConn {
	t.Helper()
	h := openFrom(t, p, addr, name)
	h.msg = "from " + name
	h.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(h, h.msg); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return h
}

// eofTrailer is what startEOFTrailerApp's app writes once it has read its
// client's FIN: only a half-close that reached it brings these bytes back.
const eofTrailer = "|eof"

// halfCloseAndDrain half-closes h, to a startEOFTrailerApp app, and reads
// what comes back until EOF: the echo of h.msg, the app's eofTrailer, then
// the app's FIN.
func (h heldConn) halfCloseAndDrain() error {
	if err := h.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	h.SetReadDeadline(time.Now().Add(2 * time.Second))
	got, err := io.ReadAll(h)
	switch {
	case isTimeout(err):
		return fmt.Errorf("no EOF within 2s of the half-close (read %q)", got)
	case err != nil:
		return fmt.Errorf("read %q, then %w", got, err)
	case string(got) != h.msg+eofTrailer:
		return fmt.Errorf("read %q before EOF, want %q", got, h.msg+eofTrailer)
	}
	return nil
}

// takeOver starts next as old's successor, as a roll does: istio-cni
// hands next pod A first and, only once some of A's connections through
// next's outbound have reached C through old's inbound (the one listener
// of C's 15008 then), pod C. It returns those connections and as many
// through old's outbound, all to C.
func takeOver(t *testing.T, old, next *sharedNode, a, c pod) []heldConn {
	t.Helper()
	next.add(t, "uid-a", a, "a")
	var viaOld, viaNext []heldConn
	for i := 0; len(viaOld) == 0 || len(viaNext) == 0; i++ {
		if i == 64 {
			t.Fatalf("64 connections from A: %d through the old gozt, %d through the new one; want both", len(viaOld), len(viaNext))
		}
		h := holdFrom(t, a, c.ip+":8082", fmt.Sprintf("A → C after the takeover #%d", i))
		var byOld, byNext bool
		eventually(t, 5*time.Second, h.name+" listed by a gozt", func() bool {
			byOld, byNext = carries(old, "uid-a", h), carries(next, "uid-a", h)
			return byOld || byNext
		})
		if byOld {
			h.name += " (old outbound, old inbound)"
			viaOld = append(viaOld, h)
		} else {
			h.name += " (new outbound, old inbound)"
			viaNext = append(viaNext, h)
		}
	}
	next.add(t, "uid-c", c, "c")
	next.snapshotSent(t)
	eventually(t, 10*time.Second, "new gozt ready", func() bool { return strings.HasPrefix(next.readiness(t), "ready") })
	return append(viaOld, viaNext...)
}

// carries reports whether the pod proxy uid of n lists h among its
// outbound connections.
func carries(n *sharedNode, uid string, h heldConn) bool {
	_, running := n.pods.handedOver()
	pp := running[uid]
	if pp == nil {
		return false
	}
	_, out := pp.p.Connections()
	for _, c := range out {
		if c.Src == h.LocalAddr().String() {
			return true
		}
	}
	return false
}

// startEOFTrailerApp listens on port inside p and echoes each connection
// until the client half-closes, then writes eofTrailer and closes.
func startEOFTrailerApp(t *testing.T, p pod, port int) {
	t.Helper()
	tcptest.Serve(t, listenIn(t, p, port), func(c net.Conn) {
		if _, err := io.Copy(c, c); err == nil {
			io.WriteString(c, eofTrailer)
		}
	})
}

// startFinFirstApp listens on port inside p; on each connection it waits
// for the client's first bytes, answers "bye" and half-closes, then reads
// what the client still sends until EOF and reports it on the channel.
func startFinFirstApp(t *testing.T, p pod, port int) <-chan string {
	t.Helper()
	got := make(chan string, 4)
	tcptest.Serve(t, listenIn(t, p, port), func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			return
		}
		io.WriteString(c, "bye")
		c.(*net.TCPConn).CloseWrite()
		rest, err := io.ReadAll(c)
		if err != nil {
			rest = append(rest, " (then "+err.Error()+")"...)
		}
		got <- string(rest)
	})
	return got
}

// listenIn listens on port of every address inside pod p.
func listenIn(t *testing.T, p pod, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	inPod(t, p, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	return ln
}

// checkFinFirst triggers the app's half-close on h: h must read "bye" and
// EOF, then still carry its own bytes and FIN to the app, and finally read
// the app's close.
func checkFinFirst(h heldConn, fins <-chan string) error {
	h.SetDeadline(time.Now().Add(2 * time.Second))
	got, err := io.ReadAll(h) // the app answers h.msg with "bye" and FIN
	if err != nil || string(got) != "bye" {
		return fmt.Errorf("the app's half-close: read %q, %v; want %q and EOF", got, err, "bye")
	}
	const after = "sent after the app's FIN"
	if _, err := io.WriteString(h, after); err != nil {
		return fmt.Errorf("write after the app's FIN: %w", err)
	}
	if err := h.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	select {
	case rest := <-fins:
		if want := h.msg[1:] + after; rest != want {
			return fmt.Errorf("the app read %q after its FIN, want %q and EOF", rest, want)
		}
	case <-time.After(2 * time.Second):
		return errors.New("the app read no EOF within 2s of the client's half-close")
	}
	return nil
}
