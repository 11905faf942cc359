package xds_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStatus: Status says connecting before the first stream, connected
// once it is established, and disconnected with the error after the server
// fails it while the client cannot reconnect.
func TestStatus(t *testing.T) {
	h := newHarness(t, nil)
	if st := h.client.Status(); st.Connected || !st.Since.IsZero() || st.LastError != "" {
		t.Fatalf("Status before Run = %+v, want zero", st)
	}
	h.start()
	h.waitReady()
	up := h.client.Status()
	if !up.Connected || up.Since.IsZero() || up.LastError != "" {
		t.Fatalf("Status when ready = %+v, want connected with no error", up)
	}

	h.down.Store(true)
	h.srv.CloseStreams(status.Error(codes.PermissionDenied, "go away"))
	waitFor(t, "a disconnected status", func() bool { return !h.client.Status().Connected })
	down := h.client.Status()
	if down.Since.Before(up.Since) || down.LastError == "" {
		t.Errorf("Status after the stream failed = %+v, want disconnected since then with the error", down)
	}
}
