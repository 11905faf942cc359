package telemetry

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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

// TestSweepKeepsWhatMayMove: a sweep deletes a series only when it names a
// workload the store no longer has and has been still, with no connection
// open, for the grace; one that comes back starts from zero.
func TestSweepKeepsWhatMayMove(t *testing.T) {
	const grace = time.Minute
	reg := prometheus.NewRegistry()
	m := NewMetricsWithConfig(reg, MetricsConfig{SeriesGrace: grace})
	store := state.NewStore(state.Config{})
	client, server, job := nsWorkload("client", "10.0.0.1"), nsWorkload("server", "10.0.0.2"), churnPod(7)
	setPods(t, store, true, client, server, job)
	log := slog.New(slog.DiscardHandler)
	conn := func(src, dst *state.Workload) *Record {
		l := Labels{Reporter: "source", ResponseFlags: FlagNone, SecurityPolicy: SecurityMutualTLS}
		l.SetSource(src)
		l.SetDestination(dst)
		return m.open(log, l, false)
	}
	received := func(dst string) float64 {
		_, v := scrapeSeries(t, reg, "istio_tcp_received_bytes_total", dst)
		return v
	}
	conn(client, server).Close(5, 5, nil) // both live: kept however still
	conn(client, job).Close(100, 1, nil)  // names the job
	held := conn(job, server)             // open across the job's removal
	setPods(t, store, false, job)

	now := time.Now()
	sweep := func(at time.Duration, want int) {
		t.Helper()
		m.sweep(store.Snapshot(), now.Add(at))
		if n, _ := scrapeSeries(t, reg, trafficCounters[0], ""); n != want {
			t.Fatalf("after a sweep at +%v: %d series, want %d", at, n, want)
		}
	}
	sweep(0, 3)           // the changes start the still time
	sweep(grace/2, 3)     // still, not for the grace
	sweep(grace, 2)       // client→job goes; held is open
	sweep(10*grace, 2)    // open: kept
	held.Close(0, 0, nil) // a change: its still time starts again
	sweep(11*grace, 2)
	sweep(12*grace-1, 2)
	sweep(12*grace, 1)
	sweep(100*grace, 1) // client→server stays
	if got := received("server"); got != 5 {
		t.Errorf("client→server received = %v, want 5", got)
	}

	setPods(t, store, true, job)
	if got := received(job.Name); got != -1 {
		t.Fatalf("deleted series scraped with %v", got)
	}
	conn(client, job).Close(7, 0, nil)
	if got := received(job.Name); got != 7 {
		t.Errorf("returning series received = %v, want 7 (from zero, not 107)", got)
	}
}

// TestMaxSeries: past MaxSeries label sets, a connection with a new one is
// counted nowhere and in gozt_metrics_series_dropped_total; known label
// sets keep counting, and a new one is taken again once a sweep made room.
func TestMaxSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetricsWithConfig(reg, MetricsConfig{MaxSeries: 3, SeriesGrace: time.Second})
	log := slog.New(slog.DiscardHandler)
	labels := func(i int) Labels {
		return Labels{Reporter: "source", ResponseFlags: FlagNone, DstWorkload: fmt.Sprint("job-", i), DstNamespace: "ns"}
	}
	for i := range 5 {
		l := labels(i)
		m.open(log, l, false).Close(10, 10, nil)
	}
	first := labels(0)
	m.open(log, first, false).Close(10, 10, nil)
	if n, v := scrapeSeries(t, reg, trafficCounters[0], "job-0"); n != 3 || v != 2 {
		t.Fatalf("series = %d, job-0 opened = %v; want 3 and 2", n, v)
	}
	if _, v := scrapeSeries(t, reg, trafficCounters[0], "job-4"); v != -1 {
		t.Errorf("job-4, past the cap, scraped with %v", v)
	}
	if got := counterValue(t, m.dropped); got != 2 {
		t.Errorf("gozt_metrics_series_dropped_total = %v, want 2", got)
	}
	// A record whose flag changes past the cap is dropped too.
	r := m.open(log, first, false)
	r.Fail(FlagConnect, nil)
	if got := counterValue(t, m.dropped); got != 3 {
		t.Errorf("gozt_metrics_series_dropped_total after a new flag = %v, want 3", got)
	}

	// None of job-0..2 is in the (empty) store: a sweep after the grace
	// frees the cap.
	now := time.Now()
	m.sweep(state.NewStore(state.Config{}).Snapshot(), now)
	m.sweep(state.NewStore(state.Config{}).Snapshot(), now.Add(time.Second))
	m.open(log, labels(4), false).Close(1, 1, nil)
	if n, v := scrapeSeries(t, reg, trafficCounters[0], "job-4"); n != 1 || v != 1 {
		t.Errorf("after a sweep: series = %d, job-4 opened = %v; want 1 and 1", n, v)
	}
}

// nsWorkload is a workload named name in namespace ns, at ip.
func nsWorkload(name, ip string) *state.Workload {
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", ServiceAccount: name,
		TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Protocol: state.TunnelHBONE}
}
