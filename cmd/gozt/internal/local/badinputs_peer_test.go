package local

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
)

// dialH2Peer opens TCP from src to dst, completes the TLS handshake with cfg
// and starts a frame-level HTTP/2 client on it, for sending what a
// well-behaved HBONE client never would (TESTPLAN 5.1 items 1–27); it does
// not send the HTTP/2 preface.
func dialH2Peer(t testing.TB, src, dst string, cfg *tls.Config) *hbonetest.Peer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		raw.Close()
		t.Fatalf("tls handshake with %s: %v", dst, err)
	}
	tc.SetDeadline(time.Time{})
	// Longer waits than hbone's own tests, for a whole gozt behind the
	// socket; frames of any size the server may send; large header blocks
	// split as a client respecting the default frame size would.
	return hbonetest.NewPeer(t, tc, hbonetest.Config{
		Wait:             15 * time.Second,
		CloseWait:        45 * time.Second,
		MaxReadFrameSize: 1 << 24,
		SplitHeaders:     true,
	})
}
