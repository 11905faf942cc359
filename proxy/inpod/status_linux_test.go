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
	waitStatus(t, h, false)
	if down := h.m.Status(); down.Since.Before(up.Since) || down.LastError == "" {
		t.Errorf("Status after istio-cni hung up = %+v, want disconnected since then with the reason", down)
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
