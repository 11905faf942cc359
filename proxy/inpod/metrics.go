package inpod

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the workload manager series of SPEC §7.2, registered without
// the istio_ prefix as ztunnel does.
type metrics struct {
	active  prometheus.Gauge
	pending prometheus.Gauge
	started prometheus.Counter
	stopped prometheus.Counter
}

// RegisterMetrics registers the workload manager series with reg, at 0,
// for a process that runs no Manager (gozt local, dedicated mode), so that
// a dashboard reads 0 there rather than "No data". A process that runs a
// Manager must not call it: New registers the same series and fails if reg
// already holds them, as one registry reports one Manager.
func RegisterMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg)
	return err
}

// newMetrics makes the series and registers them with reg, or with nothing
// if reg is nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "workload_manager_active_proxy_count",
			Help: "The current number of pods whose proxies are running.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "workload_manager_pending_proxy_count",
			Help: "The current number of pods whose proxies failed to start and are retried.",
		}),
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workload_manager_proxies_started_total",
			Help: "The total number of pod proxies started.",
		}),
		stopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workload_manager_proxies_stopped_total",
			Help: "The total number of pod proxies stopped.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.active, m.pending, m.started, m.stopped} {
		if err := reg.Register(c); err != nil {
			return nil, wrapErr(fmt.Errorf("register metrics: %w", err))
		}
	}
	return m, nil
}
