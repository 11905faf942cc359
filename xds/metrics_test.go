package xds_test

import (
	"crypto/tls"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
)

// TestRegisterMetricsAtZero: RegisterMetrics creates every known xDS series
// at 0 (the four termination reasons, both type URLs), and a Client built on
// the same registry afterwards reuses them instead of failing.
func TestRegisterMetricsAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := xds.RegisterMetrics(reg); err != nil {
		t.Fatalf("RegisterMetrics: %v", err)
	}
	if _, err := xds.NewClient(xds.Config{
		Address: "127.81.0.1:15010", TLS: &tls.Config{}, Store: state.NewStore(state.Config{}), Metrics: reg,
	}); err != nil {
		t.Fatalf("NewClient on a registry RegisterMetrics filled: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string][]string)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s%v = %v before any stream, want 0", mf.GetName(), m.GetLabel(), v)
			}
			for _, l := range m.GetLabel() {
				got[mf.GetName()] = append(got[mf.GetName()], l.GetName()+"="+l.GetValue())
			}
		}
	}
	urls := []string{"url=" + xds.AuthorizationTypeURL, "url=" + xds.AddressTypeURL} // sorted, as Gather sorts
	want := map[string][]string{
		"istio_xds_connection_terminations_total": {"reason=Complete", "reason=ConnectionError", "reason=Error", "reason=Reconnect"},
		"istio_xds_message_total":                 urls,
		"istio_xds_message_bytes_total":           urls,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("series at start-up (-want +got):\n%s", diff)
	}
}
