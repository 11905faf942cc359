package local

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/state"
)

// TestWorkloadRemovedTearsDownConnections (TESTPLAN F20): removing the
// server workload from the mesh state while connections to it are open
// tears them down at once, with no drain: the client reads a reset
// (ECONNRESET), not EOF and not a hang, and so does the server
// application. A connection to another workload keeps flowing, and
// the removal is logged.
//
// ztunnel re-checks live connections only when policies change, and drains a
// pod's connections at once when its pod is deleted (in-pod mode); gozt's
// connection manager re-checks on every state change and denies a
// connection whose destination workload is gone (fail closed), which gives
// the pod-deletion behaviour in every mode.
func TestWorkloadRemovedTearsDownConnections(t *testing.T) {
	tm := startMesh(t)
	ended := make(chan error, 8)
	listenBackend(t, tm.ips.Server+":8080", func(c net.Conn) {
		_, err := io.Copy(c, c)
		ended <- err
	})
	listenBackend(t, tm.ips.Server2+":8080", echoHandler)
	victims := make([]net.Conn, 3)
	for i := range victims {
		victims[i] = tm.socksDial(t, tm.ips.Server+":8080")
		defer victims[i].Close()
		roundTrip(t, victims[i])
	}
	other := tm.socksDial(t, tm.ips.Server2+":8080")
	defer other.Close()
	roundTrip(t, other)

	tm.Store().Update(func(b *state.Batch) {
		if !b.RemoveWorkload("Kubernetes//Pod/demo/server") {
			t.Error("server workload not in the store")
		}
	})
	for i, c := range victims {
		// Bounded: a hang fails here, not at the test's timeout.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(make([]byte, 1))
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			t.Fatalf("connection %d to the removed workload still open after 5s", i)
		case n != 0 || !errors.Is(err, syscall.ECONNRESET):
			t.Errorf("connection %d to the removed workload: read %d bytes, %v; want a reset (ECONNRESET)", i, n, err)
		}
	}
	for i := range victims {
		select {
		case err := <-ended:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("a server-side connection ended with %v, want a reset (ECONNRESET)", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d server-side connections still open 5s after the removal", i, len(victims))
		}
	}
	for range 10 {
		roundTrip(t, other)
	}
	waitLog(t, tm, "destination workload removed")
}
