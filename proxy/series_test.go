package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/tcptest"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// trafficCounters are the istio_tcp_* counters whose series a sweep
// deletes together.
var trafficCounters = []string{
	"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total",
	"istio_tcp_connections_failed_total", "istio_tcp_received_bytes_total", "istio_tcp_sent_bytes_total",
}

// scrapeSeries gathers reg and returns the number of traffic series (the
// all-empty one left out), failing unless every traffic counter has that
// many, and the value of counter name whose destination_workload is dst
// (-1 for none).
func scrapeSeries(t *testing.T, reg prometheus.Gatherer, name, dst string) (n int, value float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	value = -1
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if labelOf(s, "reporter") == "" {
				continue // the empty series, or not a traffic metric
			}
			counts[mf.GetName()]++
			if mf.GetName() == name && labelOf(s, "destination_workload") == dst {
				value = s.GetCounter().GetValue()
			}
		}
	}
	for _, c := range trafficCounters {
		if counts[c] != counts[trafficCounters[0]] {
			t.Fatalf("series per counter differ: %v", counts)
		}
	}
	return counts[trafficCounters[0]], value
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// churnPod is short-lived pod i: plain TCP, at 127.94.x.y.
func churnPod(i int) *state.Workload {
	ip := netip.AddrFrom4([4]byte{127, 94, byte(1 + i/250), byte(1 + i%250)})
	name := "job-" + strconv.Itoa(i)
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", ServiceAccount: "job",
		TrustDomain: "cluster.local", Addresses: []netip.Addr{ip}}
}

func setPods(t *testing.T, store *state.Store, add bool, pods ...*state.Workload) {
	t.Helper()
	var err error
	store.Update(func(b *state.Batch) {
		for _, w := range pods {
			if !add {
				b.RemoveWorkload(w.UID)
			} else if err = b.InsertWorkload(w); err != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

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
	live := []*state.Workload{churnPod(pods), churnPod(pods + 1)}
	live[0].Name, live[1].Name = "db", "cache"
	setPods(t, store, true, append(live, client)...)
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
	held := churnPod(0)
	var open net.Conn
	for start := 0; start < pods; start += batch {
		var churn []*state.Workload
		for i := start; i < start+batch; i++ {
			churn = append(churn, churnPod(i))
		}
		setPods(t, store, true, churn...)
		for _, w := range churn {
			if w.UID == held.UID {
				open = dial(w)
				continue
			}
			dial(w).Close()
		}
		setPods(t, store, false, churn...)
	}

	// The live pods' 2 series stay, and so does the one of the connection
	// still open; the other 999 go.
	waitSeries(t, reg, 3)
	time.Sleep(100 * time.Millisecond) // five graces: nothing more goes
	if n, _ := scrapeSeries(t, reg, trafficCounters[0], held.Name); n != 3 {
		t.Fatalf("series with a connection open to a removed pod: %d, want 3", n)
	}
	open.Close()
	waitSeries(t, reg, 2)
}

// waitSeries waits up to 10s for reg's traffic series to number want.
func waitSeries(t *testing.T, reg prometheus.Gatherer, want int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		n, _ := scrapeSeries(t, reg, trafficCounters[0], "")
		if n == want {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("traffic series = %d after 10s, want %d", n, want)
		}
	}
}
