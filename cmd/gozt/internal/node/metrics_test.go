package node

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestDashboardSeriesAtStart: right after Start, a dedicated-mode node
// exposes every series family Istio's ztunnel dashboard reads (the local
// package's dashboard test runs the dashboard itself against gozt local),
// each with at least one sample, and the workload manager series read 0
// (dedicated mode has no manager; they are registered once, at 0).
func TestDashboardSeriesAtStart(t *testing.T) {
	cp := newControlPlane(t)
	checkStartupSeries(t, cp.startNode(t, "client", "127.81.3.2"))
}

// checkStartupSeries checks n's /metrics as TestDashboardSeriesAtStart
// describes; shared mode runs it too (TestDashboardSeriesAtStartShared).
func checkStartupSeries(t *testing.T, n *Node) {
	t.Helper()
	body := get(t, "http://"+n.MetricsAddr().String()+"/metrics")
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	for _, name := range []string{
		"istio_build",
		"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total",
		"istio_tcp_sent_bytes_total", "istio_tcp_received_bytes_total", "istio_tcp_sockets_open",
		"istio_xds_connection_terminations_total", "istio_xds_message_total",
		"workload_manager_active_proxy_count", "workload_manager_pending_proxy_count",
		"workload_manager_proxies_started_total", "workload_manager_proxies_stopped_total",
		"process_open_fds", "process_max_fds", "go_goroutines",
	} {
		if len(mfs[name].GetMetric()) == 0 {
			t.Errorf("%s has no sample at start-up", name)
		}
	}
	for _, name := range []string{"workload_manager_active_proxy_count", "workload_manager_pending_proxy_count"} {
		if v := mfs[name].GetMetric()[0].GetGauge().GetValue(); v != 0 {
			t.Errorf("%s = %v with no pod, want 0", name, v)
		}
	}
}
