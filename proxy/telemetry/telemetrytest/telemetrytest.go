// Package telemetrytest helps the tests of proxy/telemetry and proxy check
// the traffic series a registry holds, with pods that come and go. Only
// tests import it.
package telemetrytest

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gozt/gozt/state"
)

// TrafficCounters are the istio_tcp_* counters whose series a sweep
// deletes together.
var TrafficCounters = []string{
	"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total",
	"istio_tcp_connections_failed_total", "istio_tcp_received_bytes_total", "istio_tcp_sent_bytes_total",
}

// Series gathers reg and returns the number of traffic series (the
// all-empty one left out) and the value of counter name whose
// destination_workload is dst (-1 for none). It returns an error if the
// traffic counters do not all have that many series, which a sweep under
// way can cause while it deletes one counter's series after another.
func Series(reg prometheus.Gatherer, name, dst string) (n int, value float64, err error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0, err
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
	for _, c := range TrafficCounters {
		if counts[c] != counts[TrafficCounters[0]] {
			return 0, value, fmt.Errorf("series per counter differ: %v", counts)
		}
	}
	return counts[TrafficCounters[0]], value, nil
}

// MustSeries is Series failing t on an error.
func MustSeries(t testing.TB, reg prometheus.Gatherer, name, dst string) (n int, value float64) {
	t.Helper()
	n, value, err := Series(reg, name, dst)
	if err != nil {
		t.Fatal(err)
	}
	return n, value
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// ChurnPod is short-lived pod i: plain TCP, at 127.94.x.y.
func ChurnPod(i int) *state.Workload {
	ip := netip.AddrFrom4([4]byte{127, 94, byte(1 + i/250), byte(1 + i%250)})
	name := "job-" + strconv.Itoa(i)
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", ServiceAccount: "job",
		TrustDomain: "cluster.local", Addresses: []netip.Addr{ip}}
}

// NSWorkload is an HBONE workload named name in namespace ns, at ip.
func NSWorkload(name, ip string) *state.Workload {
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", ServiceAccount: name,
		TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Protocol: state.TunnelHBONE}
}

// SetPods adds pods to store, or removes them, failing t on an error.
func SetPods(t testing.TB, store *state.Store, add bool, pods ...*state.Workload) {
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
