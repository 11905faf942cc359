package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/tcptest"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/proxy/telemetry/telemetrytest"
	"github.com/gozt/gozt/state"
)

// TestSweepForgetsChurnedPods (ztunnel#1719, #1942): 1,000 short-lived
// pods, each sent one connection through a proxy's SOCKS5 listener (routed
// as outbound), are removed from the store; once the grace has passed, the
// scrape's traffic series are back to those of the live pods. A connection
// still open to a removed pod keeps its series until it closes.
func TestSweepForgetsChurnedPods(t *testing.T) {
	const clientIP, pods, batch = "127.94.0.1", 1000, 100
	echo := tcptest.Echo(t, "0.0.0.0:0").(*net.TCPAddr).Port
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := state.NewStore(state.Config{})
	client := nsWorkload("w", clientIP)
	live := []*state.Workload{telemetrytest.ChurnPod(pods), telemetrytest.ChurnPod(pods + 1)}
	live[0].Name, live[1].Name = "db", "cache"
	telemetrytest.SetPods(t, store, true, append(live, client)...)
	reg := prometheus.NewRegistry()
	m := telemetry.NewMetricsWithConfig(reg, telemetry.MetricsConfig{SeriesGrace: 20 * time.Millisecond})
	serveProxy(t, Config{WorkloadUID: client.UID, BindAddr: netip.MustParseAddr(clientIP), EnableSOCKS5: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: m}, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	swept := make(chan error, 1)
	go func() { swept <- m.SweepSeries(ctx, store) }()
	defer func() { cancel(); <-swept }()
	socks, err := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(w *state.Workload) net.Conn {
		t.Helper()
		c, err := socks.Dial("tcp", netip.AddrPortFrom(w.Addresses[0], uint16(echo)).String())
		if err != nil {
			t.Fatalf("dial %s: %v", w.Name, err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatalf("echo from %s: %v", w.Name, err)
		}
		return c
	}
	for _, w := range live {
		dial(w).Close()
	}
	held := telemetrytest.ChurnPod(0)
	var open net.Conn
	for start := 0; start < pods; start += batch {
		var churn []*state.Workload
		for i := start; i < start+batch; i++ {
			churn = append(churn, telemetrytest.ChurnPod(i))
		}
		telemetrytest.SetPods(t, store, true, churn...)
		for _, w := range churn {
			if w.UID == held.UID {
				open = dial(w)
				continue
			}
			dial(w).Close()
		}
		telemetrytest.SetPods(t, store, false, churn...)
	}

	// The live pods' 2 series stay, and so does the one of the connection
	// still open; the other 999 go.
	waitSeries(t, reg, 3)
	time.Sleep(100 * time.Millisecond) // five graces: nothing more goes
	if n, _ := telemetrytest.MustSeries(t, reg, telemetrytest.TrafficCounters[0], held.Name); n != 3 {
		t.Fatalf("series with a connection open to a removed pod: %d, want 3", n)
	}
	open.Close()
	waitSeries(t, reg, 2)
}

// waitSeries waits up to 10s for reg's traffic series to number want.
func waitSeries(t *testing.T, reg prometheus.Gatherer, want int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		// A sweep under way may have deleted one counter's series and
		// not yet the next's: look again.
		n, _, err := telemetrytest.Series(reg, telemetrytest.TrafficCounters[0], "")
		if err == nil && n == want {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("traffic series = %d (%v) after 10s, want %d", n, err, want)
		}
	}
}
