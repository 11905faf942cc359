package node

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/xds"
)

// TestSharedModeWorkloadRemovedTearsDown (TESTPLAN F20) in shared mode,
// for the two paths the local-mode test does not take: a captured pod's
// outbound connection (15001, then HBONE to the other node) and an
// uncaptured client's plaintext connection to a captured pod (15006).
// When the destination workload leaves xDS, both are torn down at once:
// the clients read a reset, not EOF and not a hang, and so does the
// destination application; a connection to another pod on the same node
// keeps flowing.
func TestSharedModeWorkloadRemovedTearsDown(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	m.node(2)
	a := m.pod(1, 2, true)
	d := m.pod(1, 4, false) // not in the mesh: reaches B through B's 15006
	b, b2 := m.pod(2, 2, true), m.pod(2, 3, true)
	ended := make(chan error, 4)
	var ln net.Listener
	inPod(t, b, func() (err error) {
		ln, err = net.Listen("tcp", ":8080")
		return err
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, err := io.Copy(c, c)
				ended <- err
			}()
		}
	}()
	startApp(t, b2, 8080)

	cp := newControlPlane(t)
	n1, n2 := cp.startShared(t, "node1"), cp.startShared(t, "node2")
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("b", b.ip, "node2"), meshWorkload("b2", b2.ip, "node2"))
	n1.add(t, "uid-a", a, "a")
	n1.snapshotSent(t)
	n2.add(t, "uid-b", b, "b")
	n2.add(t, "uid-b2", b2, "b2")
	n2.snapshotSent(t)
	for _, n := range []*sharedNode{n1, n2} {
		eventually(t, 10*time.Second, n.name+" ready", func() bool { return strings.HasPrefix(n.readiness(t), "ready") })
	}

	victims := map[string]net.Conn{}
	for name, from := range map[string]pod{"outbound 15001 from A": a, "plaintext 15006 from D": d} {
		c, err := dialFrom(t, from, b.ip+":8080")
		if err != nil {
			t.Fatalf("%s: dial: %v", name, err)
		}
		defer c.Close()
		if err := ping(c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		victims[name] = c
	}
	other, err := dialFrom(t, a, b2.ip+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := ping(other); err != nil {
		t.Fatal(err)
	}

	cp.xds.Remove(xds.AddressTypeURL, "Kubernetes//Pod/demo/b")
	for name, c := range victims {
		// Bounded: a hang fails here, not at the test's timeout.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(make([]byte, 1))
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			t.Errorf("%s: still open 5s after B left xDS", name)
		case n != 0 || !errors.Is(err, syscall.ECONNRESET):
			t.Errorf("%s: read %d bytes, %v after B left xDS; want a reset (ECONNRESET)", name, n, err)
		}
	}
	for i := range len(victims) {
		select {
		case err := <-ended:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("a connection of B's application ended with %v, want a reset (ECONNRESET)", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d of B's application connections still open 5s after B left xDS", i, len(victims))
		}
	}
	for range 10 {
		if err := ping(other); err != nil {
			t.Fatalf("A → B2 after B left xDS: %v", err)
		}
	}
}
