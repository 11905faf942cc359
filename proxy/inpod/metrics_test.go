package inpod_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/proxy/inpod"
)

// TestRegisterMetrics: RegisterMetrics gives the four workload_manager
// series at 0, and refuses a registry that already holds them (a Manager's,
// or its own), so a process never reports two sets.
func TestRegisterMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := inpod.RegisterMetrics(reg); err != nil {
		t.Fatalf("RegisterMetrics: %v", err)
	}
	got := gatherValues(t, reg)
	for _, name := range []string{
		"workload_manager_active_proxy_count", "workload_manager_pending_proxy_count",
		"workload_manager_proxies_started_total", "workload_manager_proxies_stopped_total",
	} {
		if v, ok := got[name]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", name, v, ok)
		}
	}
	if len(got) != 4 {
		t.Errorf("RegisterMetrics registered %d series, want 4: %v", len(got), got)
	}
	if err := inpod.RegisterMetrics(reg); err == nil {
		t.Error("second RegisterMetrics on one registry succeeded")
	}
}

// gatherValues gathers reg and returns each family's value by name: its
// gauges' and counters' values summed over its series.
func gatherValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return got
}
