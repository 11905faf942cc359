package telemetry

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/proxy/telemetry/telemetrytest"
	"github.com/gozt/gozt/state"
)

// TestSweepKeepsWhatMayMove: a sweep deletes a series only when it names a
// workload the store no longer has and has been still, with no connection
// open, for the grace; one that comes back starts from zero.
func TestSweepKeepsWhatMayMove(t *testing.T) {
	const grace = time.Minute
	reg := prometheus.NewRegistry()
	m := NewMetricsWithConfig(reg, MetricsConfig{SeriesGrace: grace})
	store := state.NewStore(state.Config{})
	client, server, job := telemetrytest.NSWorkload("client", "10.0.0.1"), telemetrytest.NSWorkload("server", "10.0.0.2"), telemetrytest.ChurnPod(7)
	telemetrytest.SetPods(t, store, true, client, server, job)
	log := slog.New(slog.DiscardHandler)
	conn := func(src, dst *state.Workload) *Record {
		l := Labels{Reporter: "source", ResponseFlags: FlagNone, SecurityPolicy: SecurityMutualTLS}
		l.SetSource(src)
		l.SetDestination(dst)
		return m.open(log, l, false)
	}
	received := func(dst string) float64 {
		_, v := telemetrytest.MustSeries(t, reg, "istio_tcp_received_bytes_total", dst)
		return v
	}
	conn(client, server).Close(5, 5, nil) // both live: kept however still
	conn(client, job).Close(100, 1, nil)  // names the job
	held := conn(job, server)             // open across the job's removal
	telemetrytest.SetPods(t, store, false, job)

	now := time.Now()
	sweep := func(at time.Duration, want int) {
		t.Helper()
		m.sweep(store.Snapshot(), now.Add(at))
		if n, _ := telemetrytest.MustSeries(t, reg, telemetrytest.TrafficCounters[0], ""); n != want {
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

	telemetrytest.SetPods(t, store, true, job)
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
	if n, v := telemetrytest.MustSeries(t, reg, telemetrytest.TrafficCounters[0], "job-0"); n != 3 || v != 2 {
		t.Fatalf("series = %d, job-0 opened = %v; want 3 and 2", n, v)
	}
	if _, v := telemetrytest.MustSeries(t, reg, telemetrytest.TrafficCounters[0], "job-4"); v != -1 {
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
	if n, v := telemetrytest.MustSeries(t, reg, telemetrytest.TrafficCounters[0], "job-4"); n != 1 || v != 1 {
		t.Errorf("after a sweep: series = %d, job-4 opened = %v; want 1 and 1", n, v)
	}
}
