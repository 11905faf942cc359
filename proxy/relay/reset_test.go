package relay_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// resetHook gives a test leg hbone's AfterReset: Reset plays the peer's
// RST_STREAM CANCEL, which an HBONE stream reads as EOF (SPEC §2.2) while
// nothing written to it reaches the peer any more.
type resetHook struct {
	mu    sync.Mutex
	reset bool
	f     func()
}

func (h *resetHook) AfterReset(f func()) {
	h.mu.Lock()
	if h.reset {
		h.mu.Unlock()
		f()
		return
	}
	h.f = f
	h.mu.Unlock()
}

func (h *resetHook) Reset() {
	h.mu.Lock()
	h.reset = true
	f := h.f
	h.f = nil
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

// resetReadLeg is a stream leg the relay reads; resetPushLeg one that pushes.
type resetReadLeg struct {
	*opaqueConn
	resetHook
}

type resetPushLeg struct {
	*pushConn
	resetHook
}

// TestCopyEndsAfterPeerReset: once the peer of an HBONE leg resets it
// (CANCEL, read as EOF), the direction towards that leg can deliver nothing,
// so the relay closes the other leg instead of waiting for its application,
// which never writes or closes (issue 14, defect 7). The bytes sent before
// the reset still arrive, followed by an orderly EOF.
func TestCopyEndsAfterPeerReset(t *testing.T) {
	for _, tc := range []struct {
		name string
		push bool
		// early: the reset comes with the EOF, before the relay has read
		// it; otherwise after the EOF was passed on (END_STREAM, then
		// RST_STREAM CANCEL).
		early bool
	}{
		{"read/after EOF", false, false},
		{"read/with EOF", false, true},
		{"push/after EOF", true, false},
		{"push/with EOF", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, aTCP := tcpConnPair(t)
			bTCP, server := tcpConnPair(t)
			var a net.Conn
			var reset func()
			if tc.push {
				l := &resetPushLeg{pushConn: newPushConn(aTCP, 1)}
				a, reset = l, l.Reset
			} else {
				l := &resetReadLeg{opaqueConn: &opaqueConn{Conn: aTCP, tcp: aTCP}}
				a, reset = l, l.Reset
			}
			done := make(chan error, 1)
			relay.Start(a, bTCP, nil, nil, func(_ relay.Result, err error) { done <- err })
			t.Cleanup(func() {
				for _, c := range []net.Conn{client, server, aTCP, bTCP} {
					c.Close()
				}
				select {
				case <-done:
				case <-time.After(testTimeout):
					t.Errorf("relay did not end after every conn was closed")
				}
			})

			if _, err := client.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			if tc.early {
				reset()
			}
			client.CloseWrite()
			server.SetReadDeadline(time.Now().Add(testTimeout))
			got, err := io.ReadAll(server)
			if err != nil || string(got) != "last words" {
				t.Fatalf("upstream read %q, %v; want the bytes before the reset, then EOF", got, err)
			}
			if !tc.early {
				reset()
			}
			// The upstream application neither writes nor closes.
			select {
			case err := <-done:
				done <- err // for the cleanup
				if err != nil {
					t.Errorf("relay ended with %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("relay still waiting for the upstream application after the peer's reset")
			}
		})
	}
}
