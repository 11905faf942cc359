package local

import (
	"testing"
	"time"
)

// TestSocketsOpenGauge: istio_tcp_sockets_open{reporter} counts the sockets
// the listeners accepted while they are open (SPEC §7.1): both reporters
// read 0 before any traffic; a SOCKS5 client's socket counts for the source
// side and the HBONE connection it opened for the destination side; the
// client's socket stops counting when it closes.
func TestSocketsOpenGauge(t *testing.T) {
	tm := startMesh(t)
	metrics := func() string { return httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics") }
	for _, r := range []string{`reporter="source"`, `reporter="destination"`} {
		if v := metricValue(metrics(), "istio_tcp_sockets_open", r); v != 0 {
			t.Errorf("istio_tcp_sockets_open{%s} before traffic = %v, want 0", r, v)
		}
	}
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	c := tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	m := metrics()
	if v := metricValue(m, "istio_tcp_sockets_open", `reporter="source"`); v != 1 {
		t.Errorf("source sockets open with one SOCKS5 connection = %v, want 1", v)
	}
	if v := metricValue(m, "istio_tcp_sockets_open", `reporter="destination"`); v != 1 {
		t.Errorf("destination sockets open with one HBONE connection = %v, want 1", v)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for metricValue(metrics(), "istio_tcp_sockets_open", `reporter="source"`) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("source sockets open did not return to 0 after the client closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
