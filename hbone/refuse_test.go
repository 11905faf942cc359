package hbone

import (
	"net/http"
	"testing"

	"golang.org/x/net/http2"
)

// TestGoAwayLastStreamSkipsRefused: streams refused because the connection
// was full, or because it was draining, were not processed, so no GOAWAY
// names them (RFC 9113 §6.8): neither the graceful one nor the final one.
func TestGoAwayLastStreamSkipsRefused(t *testing.T) {
	release := make(chan struct{})
	srv := &Server{Config: Config{MaxConcurrentStreams: 1}, Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		s.Close()
	}}
	r, _ := rawServer(t, srv)
	r.handshakeClient()
	r.connect(1)
	r.want(func(f rawFrame) bool { return f.typ == http2.FrameHeaders && f.stream == 1 })
	r.connect(3)
	r.wantRST(3, http2.ErrCodeRefusedStream)

	shut := runAsync(func() error { return srv.Shutdown(t.Context()) })
	defer func() {
		close(release)
		<-shut
	}()
	if g := r.wantGoAway(http2.ErrCodeNo); g.last != 1 {
		t.Errorf("graceful GOAWAY last stream id %d after stream 3 was refused (full), want 1", g.last)
	}
	r.connect(5)
	r.wantRST(5, http2.ErrCodeRefusedStream)
	// A connection error now: the final GOAWAY names the same last stream.
	r.must(r.fr.WriteWindowUpdate(0, maxWindow))
	if g := r.wantGoAway(http2.ErrCodeFlowControl); g.last != 1 {
		t.Errorf("final GOAWAY last stream id %d after stream 5 was refused (draining), want 1", g.last)
	}
}
