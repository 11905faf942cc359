package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// Series defaults (docs/reference.md, Metrics).
const (
	// defaultSeriesGrace is a few scrape intervals of Istio's Prometheus
	// (15 s to 1 min): the last values of a series are scraped before it
	// goes.
	defaultSeriesGrace = 5 * time.Minute
	// defaultMaxSeries is far above a normal node: a label set is a pair of
	// workloads (deployments, not pods) with a response flag, and 110 pods
	// talking to 20 peers each with two flags make 4,400.
	defaultMaxSeries = 20_000
)

// MetricsConfig bounds the traffic series (istio_tcp_*), which ztunnel
// keeps for as long as it runs (ztunnel#1719, #1942).
type MetricsConfig struct {
	// SeriesGrace is how long a series that names a workload gone from the
	// store must go unchanged, with no connection open on it, before
	// SweepSeries deletes it. If zero, 5 minutes is used.
	SeriesGrace time.Duration
	// MaxSeries is how many label sets each traffic counter holds at most
	// (the all-empty one of seedEmptySeries aside); a connection that needs
	// a new one past it is not counted, and gozt_metrics_series_dropped_total
	// counts it. If zero, 20,000 is used.
	MaxSeries int
}

func (c MetricsConfig) seriesGrace() time.Duration {
	if c.SeriesGrace <= 0 {
		return defaultSeriesGrace
	}
	return c.SeriesGrace
}

func (c MetricsConfig) maxSeries() int {
	if c.MaxSeries <= 0 {
		return defaultMaxSeries
	}
	return c.MaxSeries
}

// series is the counters of one label set, resolved once and shared by every
// connection with those labels. A connection record holds a pointer to its
// series rather than its 27 label values: about 1 KiB less per open
// connection (gozt bench idle-memory), and each close updates the counters
// without hashing the labels again.
//
// Lifetime:
//   - A series is in Metrics.series, and its counters in the five
//     CounterVecs, from its first connection until a sweep deletes it;
//     both change together under Metrics.mu held for writing.
//   - open counts the connection records on the series. seriesFor adds one
//     under Metrics.mu held for reading, so a sweep, which deletes only
//     series with none, never deletes one a record is about to count on.
//   - The counters change only through records on the series, so one with
//     open at 0 is still. release sets moved before open drops, so a sweep
//     that reads open and then moved sees every record that left before.
//   - A refused series (past MaxSeries) is in neither the map nor the vecs:
//     its counters are Metrics.nowhere.
type series struct {
	labels                                 Labels
	opened, closed, failed, received, sent prometheus.Counter

	open  atomic.Int32
	moved atomic.Bool
	// stillSince is when a sweep first found the series unchanged with no
	// connection open; guarded by Metrics.sweepMu.
	stillSince time.Time
}

// release records that one connection left s: it closed, or moved to the
// series of another response flag.
func (s *series) release() {
	s.moved.Store(true)
	s.open.Add(-1)
}

// seriesFor returns the series of l with one more connection on it, which
// its release ends.
func (m *Metrics) seriesFor(l *Labels) *series {
	m.mu.RLock()
	s := m.series[*l]
	if s != nil {
		s.open.Add(1)
	}
	m.mu.RUnlock()
	if s != nil {
		return s
	}
	return m.newSeries(l)
}

// newSeries creates the series of l, or, past MaxSeries, returns one that
// counts nowhere. The children are made under the lock: a sweep deleting an
// earlier series of l must not delete them after they were looked up.
func (m *Metrics) newSeries(l *Labels) *series {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.series[*l]; s != nil {
		s.open.Add(1)
		return s
	}
	if len(m.series) >= m.cfg.maxSeries() {
		m.dropped.Inc()
		s := &series{labels: *l, opened: m.nowhere[0], closed: m.nowhere[1], failed: m.nowhere[2],
			received: m.nowhere[3], sent: m.nowhere[4]}
		s.open.Store(1)
		return s
	}
	v := l.values()
	s := &series{
		labels:   *l,
		opened:   m.opened.WithLabelValues(v...),
		closed:   m.closed.WithLabelValues(v...),
		failed:   m.failed.WithLabelValues(v...),
		received: m.received.WithLabelValues(v...),
		sent:     m.sent.WithLabelValues(v...),
	}
	s.open.Store(1)
	s.moved.Store(true)
	m.series[*l] = s
	return s
}

// Snapshotter gives the newest snapshot of the mesh state; *state.Store is
// one.
type Snapshotter interface {
	Snapshot() *state.Snapshot
}

var _ Snapshotter = (*state.Store)(nil)

// SweepSeries deletes, until ctx is done, the traffic series that name a
// workload gone from store's snapshot and have not changed, with no
// connection open, for MetricsConfig.SeriesGrace. It looks every quarter of
// the grace and returns nil when ctx is done.
//
// A series is kept while each workload it names (source_workload,
// destination_workload, with their namespace and cluster) is in the store:
// however still, it may move again. One whose only workloads are unknown is
// kept too. One that names a workload the store no longer has can move
// again only if a workload of that name returns, and then it starts from
// zero, as a Prometheus counter may (rate() reads it as a reset).
func (m *Metrics) SweepSeries(ctx context.Context, store Snapshotter) error {
	t := time.NewTicker(max(m.cfg.seriesGrace()/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			m.sweep(store.Snapshot(), now)
		}
	}
}

// workloadKey names a workload as the traffic labels do.
type workloadKey struct{ namespace, name, cluster string }

func (l *Labels) srcKey() workloadKey {
	return workloadKey{l.SrcNamespace, l.SrcWorkload, l.SrcCluster}
}

func (l *Labels) dstKey() workloadKey {
	return workloadKey{l.DstNamespace, l.DstWorkload, l.DstCluster}
}

// sweep deletes the series that have been still for the grace at now and
// name a workload snap lacks; it returns how many.
func (m *Metrics) sweep(snap *state.Snapshot, now time.Time) int {
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	still := m.stillSeries(now)
	if len(still) == 0 {
		return 0
	}
	present := make(map[workloadKey]bool)
	for _, s := range still {
		for _, k := range [2]workloadKey{s.labels.srcKey(), s.labels.dstKey()} {
			if k.name != "" {
				present[k] = false
			}
		}
	}
	snap.RangeWorkloadNames(func(namespace, name, workloadName, cluster string) {
		if workloadName == "" {
			workloadName = name // as workloadName(w)
		}
		k := workloadKey{namespace, workloadName, cluster}
		if _, ok := present[k]; ok {
			present[k] = true
		}
	})
	gone := func(k workloadKey) bool { return k.name != "" && !present[k] }

	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range still {
		l := &s.labels
		if !gone(l.srcKey()) && !gone(l.dstKey()) {
			continue
		}
		if s.open.Load() > 0 || s.moved.Load() {
			continue // it moved since stillSeries; the next sweep sees it
		}
		delete(m.series, *l)
		v := l.values()
		for _, c := range []*prometheus.CounterVec{m.opened, m.closed, m.failed, m.received, m.sent} {
			c.DeleteLabelValues(v...)
		}
		n++
	}
	return n
}

// stillSeries returns the series unchanged, with no connection open, for
// the grace at now, and starts the still time of those that were not.
func (m *Metrics) stillSeries(now time.Time) []*series {
	grace := m.cfg.seriesGrace()
	var still []*series
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, s := range m.series {
		if s.open.Load() > 0 || s.moved.Swap(false) {
			s.stillSince = now
			continue
		}
		if now.Sub(s.stillSince) >= grace {
			still = append(still, s)
		}
	}
	return still
}
