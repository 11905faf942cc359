package proxy

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/state"
)

// trafficLabelNames are the labels of the traffic metrics, in ztunnel's order
// (SPEC §7.1). The four locality labels are always present here; ztunnel adds
// them only when one side has workload info, which a Prometheus registry
// cannot express per series (documented in README).
var trafficLabelNames = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision",
	"source_workload_namespace", "source_principal", "source_app", "source_version", "source_cluster",
	"destination_service", "destination_service_namespace", "destination_service_name",
	"destination_workload", "destination_canonical_service", "destination_canonical_revision",
	"destination_workload_namespace", "destination_principal", "destination_app", "destination_version",
	"destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
	"source_region", "source_zone", "destination_region", "destination_zone",
}

// Response flags (SPEC §7.1).
const (
	flagNone    = "-"
	flagDeny    = "DENY"
	flagConnect = "CONNECT"
)

// Security policies (SPEC §7.1).
const (
	securityMutualTLS = "mutual_tls"
	securityUnknown   = "unknown"
)

// Metrics holds the traffic metrics shared by every proxy of a process.
type Metrics struct {
	opened   *prometheus.CounterVec
	closed   *prometheus.CounterVec
	failed   *prometheus.CounterVec
	received *prometheus.CounterVec
	sent     *prometheus.CounterVec
	sockets  *prometheus.GaugeVec
}

// NewMetrics registers the traffic metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, trafficLabelNames)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		opened:   counter("istio_tcp_connections_opened_total", "The total number of TCP connections opened"),
		closed:   counter("istio_tcp_connections_closed_total", "The total number of TCP connections closed"),
		failed:   counter("istio_tcp_connections_failed_total", "The total number of TCP connections that failed to establish (unstable)"),
		received: counter("istio_tcp_received_bytes_total", "The size of total bytes received during request in case of a TCP connection"),
		sent:     counter("istio_tcp_sent_bytes_total", "The size of total bytes sent during response in case of a TCP connection"),
		sockets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "istio_tcp_sockets_open", Help: "The current number of open TCP sockets (unstable)",
		}, []string{"reporter"}),
	}
	reg.MustRegister(m.sockets)
	return m
}

// trafficLabels are the label values of one connection; a struct, not a
// slice, so a missing value is visible (STYLE 40).
type trafficLabels struct {
	reporter string

	srcWorkload, srcCanonicalService, srcCanonicalRevision, srcNamespace string
	srcPrincipal, srcApp, srcVersion, srcCluster                         string

	dstService, dstServiceNamespace, dstServiceName                      string
	dstWorkload, dstCanonicalService, dstCanonicalRevision, dstNamespace string
	dstPrincipal, dstApp, dstVersion, dstCluster                         string

	responseFlags, securityPolicy          string
	srcRegion, srcZone, dstRegion, dstZone string
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (l *trafficLabels) values() []string {
	v := []string{
		l.reporter,
		l.srcWorkload, l.srcCanonicalService, l.srcCanonicalRevision, l.srcNamespace,
		l.srcPrincipal, l.srcApp, l.srcVersion, l.srcCluster,
		l.dstService, l.dstServiceNamespace, l.dstServiceName,
		l.dstWorkload, l.dstCanonicalService, l.dstCanonicalRevision, l.dstNamespace,
		l.dstPrincipal, l.dstApp, l.dstVersion, l.dstCluster,
		"tcp", l.responseFlags, l.securityPolicy,
		l.srcRegion, l.srcZone, l.dstRegion, l.dstZone,
	}
	for i := range v {
		v[i] = orUnknown(v[i])
	}
	return v
}

func (l *trafficLabels) setSource(w *state.Workload) {
	if w == nil {
		return
	}
	l.srcWorkload = workloadName(w)
	l.srcCanonicalService, l.srcCanonicalRevision = w.CanonicalName, w.CanonicalRevision
	l.srcNamespace = w.Namespace
	l.srcApp, l.srcVersion = w.CanonicalName, w.CanonicalRevision
	l.srcCluster = w.ClusterID
	l.srcRegion, l.srcZone = w.Locality.Region, w.Locality.Zone
}

func (l *trafficLabels) setDestination(w *state.Workload) {
	if w == nil {
		return
	}
	l.dstWorkload = workloadName(w)
	l.dstCanonicalService, l.dstCanonicalRevision = w.CanonicalName, w.CanonicalRevision
	l.dstNamespace = w.Namespace
	l.dstApp, l.dstVersion = w.CanonicalName, w.CanonicalRevision
	l.dstCluster = w.ClusterID
	l.dstRegion, l.dstZone = w.Locality.Region, w.Locality.Zone
	l.dstPrincipal = principal(w.Identity())
}

func (l *trafficLabels) setService(s *state.Service) {
	if s == nil {
		return
	}
	l.dstService, l.dstServiceNamespace, l.dstServiceName = s.Hostname, s.Namespace, s.Name
}

func workloadName(w *state.Workload) string {
	if w.WorkloadName != "" {
		return w.WorkloadName
	}
	return w.Name
}

func principal(id identity.Identity) string {
	if id.IsZero() {
		return ""
	}
	return id.String()
}

// connRecord follows one proxied connection from open to close: metrics and
// the access log line (SPEC §7.1, §7.3).
type connRecord struct {
	m       *Metrics
	log     *slog.Logger
	labels  trafficLabels
	values  []string
	start   time.Time
	inbound bool

	srcAddr, dstAddr, hboneAddr string
}

// open records the connection as opened.
func (m *Metrics) open(log *slog.Logger, l trafficLabels, inbound bool) *connRecord {
	r := &connRecord{m: m, log: log, labels: l, start: time.Now(), inbound: inbound}
	r.values = l.values()
	m.opened.WithLabelValues(r.values...).Inc()
	return r
}

// fail closes a connection that failed before carrying bytes. The close
// carries the failure flag; the open was recorded with "-" as ztunnel does
// (the flag is only known at the end).
func (r *connRecord) fail(flag string, err error) {
	r.labels.responseFlags = flag
	r.values = r.labels.values()
	r.close(0, 0, err)
}

// close records bytes, the close, and writes the access log. sent is what
// flowed client→server (request direction), recv server→client.
func (r *connRecord) close(requestBytes, responseBytes int64, err error) {
	r.m.received.WithLabelValues(r.values...).Add(float64(requestBytes))
	r.m.sent.WithLabelValues(r.values...).Add(float64(responseBytes))
	r.m.closed.WithLabelValues(r.values...).Inc()
	if r.labels.responseFlags != flagNone && r.labels.responseFlags != "" {
		r.m.failed.WithLabelValues(r.values...).Inc()
	}
	// bytes_sent / bytes_recv are from the reporting ztunnel's view toward
	// its peer (SPEC §7.3).
	bytesSent, bytesRecv := requestBytes, responseBytes
	direction := "outbound"
	if r.inbound {
		bytesSent, bytesRecv = responseBytes, requestBytes
		direction = "inbound"
	}
	attrs := []slog.Attr{
		slog.String("src.addr", r.srcAddr),
		slog.String("src.workload", r.labels.srcWorkload),
		slog.String("src.namespace", r.labels.srcNamespace),
	}
	// Identities are logged only for mTLS connections (SPEC §7.3); they are
	// the principals already in the labels.
	mtls := r.labels.securityPolicy == securityMutualTLS
	if mtls && r.labels.srcPrincipal != "" {
		attrs = append(attrs, slog.String("src.identity", r.labels.srcPrincipal))
	}
	attrs = append(attrs, slog.String("dst.addr", r.dstAddr))
	if r.hboneAddr != "" {
		attrs = append(attrs, slog.String("dst.hbone_addr", r.hboneAddr))
	}
	attrs = append(attrs,
		slog.String("dst.service", r.labels.dstService),
		slog.String("dst.workload", r.labels.dstWorkload),
		slog.String("dst.namespace", r.labels.dstNamespace),
	)
	if mtls && r.labels.dstPrincipal != "" {
		attrs = append(attrs, slog.String("dst.identity", r.labels.dstPrincipal))
	}
	attrs = append(attrs,
		slog.String("direction", direction),
		slog.Int64("bytes_sent", bytesSent),
		slog.Int64("bytes_recv", bytesRecv),
		slog.String("duration", durationMillis(time.Since(r.start))),
	)
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	r.log.LogAttrs(context.Background(), level, "connection complete", attrs...)
}

func durationMillis(d time.Duration) string {
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}
