package dns

import (
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// labelNames are the labels of every DNS metric, in ztunnel's order
// (SPEC §7.2).
var labelNames = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// unknown is the value of a label nothing fills (SPEC §7).
const unknown = "unknown"

// labels is the label set of one DNS request.
type labels struct {
	queryType string // lower case: "a", "aaaa", "srv"
	protocol  string // "udp" or "tcp"
	service   string // the client's canonical service
	revision  string // the client's canonical revision
}

func (l labels) values() []string {
	return []string{l.queryType, l.protocol, l.service, l.revision}
}

// labelsFor returns the labels of a query of qtype over proto from client
// (or nil when the source is unknown).
func labelsFor(qtype uint16, proto string, client *state.Workload) labels {
	l := labels{queryType: strings.ToLower(dns.Type(qtype).String()), protocol: proto, service: unknown, revision: unknown}
	if client != nil {
		l.service = orUnknown(client.CanonicalName)
		l.revision = orUnknown(client.CanonicalRevision)
	}
	return l
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

// Metrics holds the istio_dns_* metrics of a process (SPEC §7.2), shared by
// every workload's DNS server.
type Metrics struct {
	requests         *prometheus.CounterVec
	upstreamRequests *prometheus.CounterVec
	upstreamFailures *prometheus.CounterVec
	upstreamDuration *prometheus.HistogramVec

	// tcpRefused counts TCP connections a server closed at once because it
	// held MaxTCPConns (gozt only).
	tcpRefused prometheus.Counter
}

// NewMetrics registers the DNS metrics on reg. Every mode registers them at
// start, whether or not the DNS proxy runs, and each counter starts with its
// one series whose every label is empty, at 0: a CounterVec without a series
// is absent from the exposition, and the ztunnel dashboard's
// sum by (pod) (rate(istio_dns_requests_total[1m])) would read "No data"
// instead of 0 until the first query. The series stands for no query and is
// never counted (a query's request_protocol is always udp or tcp, its other
// labels a value or "unknown"); Prometheus stores the empty labels as
// absent, so any query filtering on a DNS label leaves it out. This is the
// convention of the traffic counters (telemetry.NewMetrics).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_requests_total",
			Help: "Total number of DNS requests (unstable)",
		}, labelNames),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_requests_total",
			Help: "Total number of DNS requests forwarded to upstream (unstable)",
		}, labelNames),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_failures_total",
			Help: "Total number of DNS requests that failed to forward upstream (unstable)",
		}, labelNames),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_dns_upstream_request_duration_seconds",
			Help:    "Total time in seconds Istio takes to get DNS response from upstream (unstable)",
			Buckets: []float64{0.0005, 0.001, 0.01, 0.1, 1, 5},
		}, labelNames),
		tcpRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gozt_dns_tcp_connections_refused_total",
			Help: "TCP connections to a DNS proxy closed at once because that proxy already held its maximum (gozt only)",
		}),
	}
	reg.MustRegister(m.requests, m.upstreamRequests, m.upstreamFailures, m.upstreamDuration, m.tcpRefused)
	empty := make([]string, len(labelNames))
	for _, c := range []*prometheus.CounterVec{m.requests, m.upstreamRequests, m.upstreamFailures} {
		c.WithLabelValues(empty...)
	}
	return m
}

// request counts one request, answered locally or forwarded.
func (m *Metrics) request(l labels) { m.requests.WithLabelValues(l.values()...).Inc() }

// forwarded records one upstream request that took d and failed if failed.
func (m *Metrics) forwarded(l labels, d time.Duration, failed bool) {
	v := l.values()
	m.upstreamRequests.WithLabelValues(v...).Inc()
	m.upstreamDuration.WithLabelValues(v...).Observe(d.Seconds())
	if failed {
		m.upstreamFailures.WithLabelValues(v...).Inc()
	}
}
