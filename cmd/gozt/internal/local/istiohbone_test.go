package local

import (
	"io"
	"net"
	"testing"
	"time"

	istiohbone "istio.io/istio/pkg/hbone"
)

// TestIstioHBONEDialer: Istio's own Go HBONE dialer (istio.io/istio/pkg/hbone,
// used by Istio's test framework) tunnels through our inbound 15008 and
// exchanges bytes both ways with a backend.
func TestIstioHBONEDialer(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	timeout := 5 * time.Second
	d := istiohbone.NewDialer(istiohbone.Config{
		ProxyAddress: net.JoinHostPort(tm.ips.Server, "15008"),
		TLS:          tm.clientTLS(t),
		Timeout:      &timeout,
	})
	c, err := d.Dial("tcp", tm.ips.Server+":8080")
	if err != nil {
		t.Fatalf("Istio HBONE dial: %v", err)
	}
	msg := []byte("hello from istio's dialer")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Errorf("echo through Istio's dialer = %q, %v", got, err)
	}
	c.Close()
	if src := b.accepted(); len(src) != 1 {
		t.Errorf("backend accepted %d connections, want 1", len(src))
	}
}
