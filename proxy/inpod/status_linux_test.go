package inpod_test

import (
	"testing"
	"time"
)

// TestStatus: Status says connected once the Manager has said hello, and
// disconnected with the reason once istio-cni hangs up, since then.
func TestStatus(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	waitStatus(t, h, true)
	up := h.m.Status()
	if up.Since.IsZero() || up.LastError != "" {
		t.Fatalf("Status when connected = %+v, want since the connection, no error", up)
	}
	c.Close()
	// The Manager reconnects within milliseconds (its backoff starts at
	// 10 ms), so the disconnected state may be gone before a poll sees it;
	// what must stay is the reason, with a since no earlier than the first
	// connection's.
	deadline := time.Now().Add(waitTimeout)
	for h.m.Status().LastError == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no reason recorded %v after istio-cni hung up: %+v", waitTimeout, h.m.Status())
		}
		time.Sleep(time.Millisecond)
	}
	if down := h.m.Status(); down.Since.Before(up.Since) || down.LastError == "" {
		t.Errorf("Status after istio-cni hung up = %+v, want the reason and a since after %v", down, up.Since)
	}
	h.accept().Close() // the Manager reconnects
}

// waitStatus waits until Status().Connected is connected.
func waitStatus(t *testing.T, h *harness, connected bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for h.m.Status().Connected != connected {
		if time.Now().After(deadline) {
			t.Fatalf("Status().Connected stayed %v for %v: %+v", !connected, waitTimeout, h.m.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
