package telemetry

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/state"
)

// trafficLabelNames are the labels of the traffic metrics, in ztunnel's order
// (SPEC §7.1). The four locality labels are always present here; ztunnel adds
// them only when one side has workload info, which a Prometheus registry
// cannot express per series (documented in docs/reference.md, Metrics).
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
	FlagNone    = "-"
	FlagDeny    = "DENY"
	FlagConnect = "CONNECT" // every failure not classified below
	// FlagTLS: the TLS handshake with the HBONE peer failed.
	FlagTLS = "TLS_FAILURE"
	// FlagH2: the HTTP/2 handshake after TLS failed.
	FlagH2 = "H2_HANDSHAKE_FAILURE"
	// FlagNetworkPolicy: connecting to an HBONE port timed out.
	FlagNetworkPolicy = "NETWORK_POLICY"
	// FlagIdentity: the source's own certificate could not be had.
	FlagIdentity = "IDENTITY_ERROR"
	// FlagRevoked: a CRL_PATH list revoked the peer's certificate chain.
	FlagRevoked = "CERT_REVOKED"
)

// Security policies (SPEC §7.1).
const (
	SecurityMutualTLS = "mutual_tls"
	SecurityUnknown   = "unknown"
)

// Reasons a connection is shed, the reason label of
// gozt_connections_shed_total.
const (
	ShedFDExhausted    = "fd_exhausted"
	ShedMemoryPressure = "memory_pressure"
)

// Reasons an on-demand fetch was refused (gozt_xds_on_demand_refused_total).
const (
	DemandRefusedRate        = "rate"
	DemandRefusedOutstanding = "outstanding"
)

// listenerReporter is the istio_tcp_sockets_open reporter of the sockets
// of each proxy listener, by the listener label of gozt's own metrics:
// source for the client side (outbound, SOCKS5), destination for inbound.
var listenerReporter = map[string]string{
	"outbound": "source", "socks5": "source", "plaintext": "destination", "inbound": "destination",
}

// DNSListener is the DNS proxy's TCP listener in gozt_connections_shed_total.
const DNSListener = "dns"

// Metrics holds the traffic metrics shared by every proxy of a process.
// Its methods may be called concurrently.
type Metrics struct {
	opened   *prometheus.CounterVec
	closed   *prometheus.CounterVec
	failed   *prometheus.CounterVec
	received *prometheus.CounterVec
	sent     *prometheus.CounterVec
	sockets  *prometheus.GaugeVec

	// onDemandDNS counts lookups of endpoint hostnames (SPEC §7.1).
	onDemandDNS *prometheus.CounterVec

	// crlRejections counts handshakes refused and tunnels closed because a
	// CRL revoked the peer; crlUntracked counts tunnels a CRL change could
	// not re-check (SPEC §7.1).
	crlRejections, crlUntracked *prometheus.CounterVec

	// forwarded counts inbound connections whose upstream source came from
	// a trusted waypoint's Forwarded for= (gozt only, TRUST_WAYPOINT_FORWARDED),
	// by the waypoint's principal: the traffic labels keep the real peer.
	forwarded *prometheus.CounterVec

	// panics counts connection handlers that panicked and were contained,
	// by listener (gozt only, TESTPLAN F26).
	panics *prometheus.CounterVec

	// shed counts connections refused at once to protect the process, by
	// listener (the DNS proxy's TCP listener is "dns") and reason: fd_exhausted (reset with the spare descriptor,
	// or by restarting the listen when the spare is lost, proxy's accept.go) or
	// memory_pressure (package admission) (gozt only, TESTPLAN F21, F22).
	shed *prometheus.CounterVec
	// demandRefusals counts on-demand fetches a proxy's DemandLimits
	// refused, by reason.
	demandRefusals *prometheus.CounterVec

	cfg MetricsConfig
	// dropped counts the connections whose new label set the MaxSeries
	// cap refused (series.go).
	dropped prometheus.Counter
	// nowhere are the counters of a refused label set: registered nowhere,
	// shared by every refused connection.
	nowhere [5]prometheus.Counter

	// sweepMu serializes sweeps; it guards every series' stillSince.
	sweepMu sync.Mutex

	mu     sync.RWMutex
	series map[Labels]*series
}

// NewMetrics registers the traffic metrics with reg, with the default
// MetricsConfig.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return NewMetricsWithConfig(reg, MetricsConfig{})
}

// NewMetricsWithConfig registers the traffic metrics with reg; cfg bounds
// the traffic series (series.go).
func NewMetricsWithConfig(reg prometheus.Registerer, cfg MetricsConfig) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, trafficLabelNames)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		onDemandDNS: newOnDemandDNS(reg),

		opened:   counter("istio_tcp_connections_opened_total", "The total number of TCP connections opened"),
		closed:   counter("istio_tcp_connections_closed_total", "The total number of TCP connections closed"),
		failed:   counter("istio_tcp_connections_failed_total", "The total number of TCP connections that failed to establish (unstable)"),
		received: counter("istio_tcp_received_bytes_total", "The size of total bytes received during request in case of a TCP connection"),
		sent:     counter("istio_tcp_sent_bytes_total", "The size of total bytes sent during response in case of a TCP connection"),
		sockets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "istio_tcp_sockets_open", Help: "The current number of open TCP sockets (unstable)",
		}, []string{"reporter"}),
		crlRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_crl_policy_rejections_total", Help: "Connections rejected because a CRL revoked the peer's certificate (unstable)",
		}, []string{"reporter"}),
		crlUntracked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_crl_untracked_connections_total", Help: "Connections a CRL change could not re-check (unstable)",
		}, []string{"reporter"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gozt_inbound_forwarded_source_total",
			Help: "Inbound connections dialed from the client IP a trusted waypoint's Forwarded header named (gozt only)",
		}, []string{"source_principal"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gozt_connection_handler_panics_total",
			Help: "Connection handlers that panicked; the panic closed that connection only (gozt only)",
		}, []string{"listener"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gozt_connections_shed_total",
			Help: "New connections refused at once (a TCP reset, or 503 to a CONNECT) because the process ran out of file descriptors or memory (gozt only)",
		}, []string{"listener", "reason"}),
		demandRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gozt_xds_on_demand_refused_total",
			Help: "On-demand xDS lookups not sent because the proxy's rate or outstanding bound was reached; the connection was decided as after a miss (gozt only)",
		}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gozt_metrics_series_dropped_total",
			Help: "Connections not counted in the istio_tcp_* metrics because their label set was new and the metrics held METRICS_MAX_SERIES label sets (gozt only)",
		}),
		cfg:    cfg,
		series: make(map[Labels]*series),
	}
	for i := range m.nowhere {
		m.nowhere[i] = prometheus.NewCounter(prometheus.CounterOpts{Name: "nowhere", Help: "never registered"})
	}
	reg.MustRegister(m.sockets, m.crlRejections, m.crlUntracked, m.forwarded, m.panics, m.shed, m.demandRefusals, m.dropped)
	for _, reason := range []string{DemandRefusedRate, DemandRefusedOutstanding} {
		m.demandRefusals.WithLabelValues(reason)
	}
	shedReasons := func(listener string) {
		for _, reason := range []string{ShedFDExhausted, ShedMemoryPressure} {
			m.shed.WithLabelValues(listener, reason)
		}
	}
	for name := range listenerReporter {
		m.panics.WithLabelValues(name)
		shedReasons(name)
	}
	shedReasons(DNSListener) // the DNS proxy's TCP listener
	// Both reporters exist from the start, at 0, so a dashboard shows 0
	// rather than "No data".
	for _, r := range []string{"source", "destination"} {
		m.sockets.WithLabelValues(r)
		m.crlRejections.WithLabelValues(r)
		m.crlUntracked.WithLabelValues(r)
	}
	m.seedEmptySeries()
	return m
}

// DemandRefusals is the counter of on-demand fetches refused for reason
// (DemandRefusedRate, DemandRefusedOutstanding).
func (m *Metrics) DemandRefusals(reason string) prometheus.Counter {
	return m.demandRefusals.WithLabelValues(reason)
}

// Shed is the counter of new connections on listener refused at once for
// reason (ShedFDExhausted, ShedMemoryPressure).
func (m *Metrics) Shed(listener, reason string) prometheus.Counter {
	return m.shed.WithLabelValues(listener, reason)
}

// Panics is the counter of connection handlers on listener that panicked
// and were contained.
func (m *Metrics) Panics(listener string) prometheus.Counter {
	return m.panics.WithLabelValues(listener)
}

// ForwardedSource is the counter of inbound connections whose upstream
// source came from the Forwarded header of the trusted waypoint with
// principal.
func (m *Metrics) ForwardedSource(principal string) prometheus.Counter {
	return m.forwarded.WithLabelValues(principal)
}

// CRLRejections is the counter of reporter's handshakes refused and tunnels
// closed because a CRL revoked the peer.
func (m *Metrics) CRLRejections(reporter string) prometheus.Counter {
	return m.crlRejections.WithLabelValues(reporter)
}

// CRLUntracked is the counter of reporter's tunnels a CRL change could not
// re-check.
func (m *Metrics) CRLUntracked(reporter string) prometheus.Counter {
	return m.crlUntracked.WithLabelValues(reporter)
}

// seedEmptySeries creates, at 0, the one series of each traffic counter
// whose every label is empty, so that an unfiltered aggregation such as the
// ztunnel dashboard's sum by (pod) (rate(istio_tcp_connections_opened_total[1m]))
// reads 0 from start-up instead of "No data".
//
// The series stands for no connection and is never counted: a connection's
// labels are never empty (values maps a missing one to "unknown", and
// request_protocol is always "tcp"), so no traffic can land in it. Prometheus
// treats an empty label as an absent one, so the series is stored with only
// the scrape's target labels, and it drops out of any query that filters on
// a traffic label (reporter="source", destination_workload=~"...", as Istio's
// workload and service dashboards and Kiali do). Seeding real-looking label
// sets instead (per local workload, or all "unknown") would invent series
// that traffic later joins or that look like traffic.
func (m *Metrics) seedEmptySeries() {
	empty := make([]string, len(trafficLabelNames))
	for _, c := range []*prometheus.CounterVec{m.opened, m.closed, m.failed, m.received, m.sent} {
		c.WithLabelValues(empty...)
	}
}

// SocketsOpen is the istio_tcp_sockets_open gauge of the reporter of
// listener's sockets: accepted sockets currently open (SPEC §7.1).
func (m *Metrics) SocketsOpen(listener string) prometheus.Gauge {
	return m.sockets.WithLabelValues(listenerReporter[listener])
}

// Labels are the label values of one connection; a struct, not a slice, so
// a missing value is visible (STYLE 40). An empty value is exported as
// "unknown".
type Labels struct {
	Reporter string

	SrcWorkload, SrcCanonicalService, SrcCanonicalRevision, SrcNamespace string
	SrcPrincipal, SrcApp, SrcVersion, SrcCluster                         string

	DstService, DstServiceNamespace, DstServiceName                      string
	DstWorkload, DstCanonicalService, DstCanonicalRevision, DstNamespace string
	DstPrincipal, DstApp, DstVersion, DstCluster                         string

	ResponseFlags, SecurityPolicy          string
	SrcRegion, SrcZone, DstRegion, DstZone string
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (l *Labels) values() []string {
	v := []string{
		l.Reporter,
		l.SrcWorkload, l.SrcCanonicalService, l.SrcCanonicalRevision, l.SrcNamespace,
		l.SrcPrincipal, l.SrcApp, l.SrcVersion, l.SrcCluster,
		l.DstService, l.DstServiceNamespace, l.DstServiceName,
		l.DstWorkload, l.DstCanonicalService, l.DstCanonicalRevision, l.DstNamespace,
		l.DstPrincipal, l.DstApp, l.DstVersion, l.DstCluster,
		"tcp", l.ResponseFlags, l.SecurityPolicy,
		l.SrcRegion, l.SrcZone, l.DstRegion, l.DstZone,
	}
	for i := range v {
		v[i] = orUnknown(v[i])
	}
	return v
}

// SetSource sets the source workload labels from w, if not nil; the
// principal is left as it is.
func (l *Labels) SetSource(w *state.Workload) {
	if w == nil {
		return
	}
	l.SrcWorkload = workloadName(w)
	l.SrcCanonicalService, l.SrcCanonicalRevision = w.CanonicalName, w.CanonicalRevision
	l.SrcNamespace = w.Namespace
	l.SrcApp, l.SrcVersion = w.CanonicalName, w.CanonicalRevision
	l.SrcCluster = w.ClusterID
	l.SrcRegion, l.SrcZone = w.Locality.Region, w.Locality.Zone
}

// SetDestination sets the destination workload labels from w, if not nil,
// its principal its own identity.
func (l *Labels) SetDestination(w *state.Workload) {
	if w == nil {
		return
	}
	l.DstWorkload = workloadName(w)
	l.DstCanonicalService, l.DstCanonicalRevision = w.CanonicalName, w.CanonicalRevision
	l.DstNamespace = w.Namespace
	l.DstApp, l.DstVersion = w.CanonicalName, w.CanonicalRevision
	l.DstCluster = w.ClusterID
	l.DstRegion, l.DstZone = w.Locality.Region, w.Locality.Zone
	l.DstPrincipal = Principal(w.Identity())
}

// SetService sets the destination service labels from s, if not nil.
func (l *Labels) SetService(s *state.Service) {
	if s == nil {
		return
	}
	l.DstService, l.DstServiceNamespace, l.DstServiceName = s.Hostname, s.Namespace, s.Name
}

func workloadName(w *state.Workload) string {
	if w.WorkloadName != "" {
		return w.WorkloadName
	}
	return w.Name
}

// Principal is id as the labels and logs name it: its SPIFFE URI, or ""
// for none.
func Principal(id identity.Identity) string {
	if id.IsZero() {
		return ""
	}
	return id.String()
}

// Record follows one proxied connection from open to close: metrics and
// the access log line (SPEC §7.1, §7.3). It lives as long as the connection,
// so it is kept small: the labels are in the shared series. It is used by
// one goroutine at a time: the connection's handler, then its finish.
type Record struct {
	m       *Metrics
	log     *slog.Logger
	s       *series
	start   time.Time
	inbound bool

	srcAddr, dstAddr netip.AddrPort
	hboneAddr        string
	live             *ConnList // the list this record is on, if any
}

// Open records the connection from src to dst (and the CONNECT authority
// hboneAddr, "" for none) as opened, and logs it at DEBUG to log, which
// also receives its access log line at the close (SPEC §7.3).
func (m *Metrics) Open(log *slog.Logger, l Labels, inbound bool, src, dst netip.AddrPort, hboneAddr string) *Record {
	r := &Record{m: m, log: log, s: m.seriesFor(&l), start: time.Now(), inbound: inbound,
		srcAddr: src, dstAddr: dst, hboneAddr: hboneAddr}
	r.s.opened.Inc()
	if log.Enabled(context.Background(), slog.LevelDebug) {
		log.LogAttrs(context.Background(), slog.LevelDebug, "connection opened", r.endpointAttrs(nil)...)
	}
	return r
}

// bare is a log value written unquoted, as ztunnel writes its Display
// fields (addresses).
type bare string

func (b bare) String() string { return string(b) }

// endpointAttrs appends the access log's fields naming both ends (SPEC
// §7.3), in ztunnel's order; a field without a value is left out, as
// ztunnel leaves out what it does not know. Identities are logged only for
// mTLS connections; they are the principals already in the labels.
func (r *Record) endpointAttrs(attrs []slog.Attr) []slog.Attr {
	l := &r.s.labels
	mtls := l.SecurityPolicy == SecurityMutualTLS
	str := func(key, v string) {
		if v != "" {
			attrs = append(attrs, slog.String(key, v))
		}
	}
	attrs = append(attrs, slog.Any("src.addr", r.srcAddr))
	str("src.workload", l.SrcWorkload)
	str("src.namespace", l.SrcNamespace)
	if mtls {
		str("src.identity", l.SrcPrincipal)
	}
	str("src.cluster", l.SrcCluster)
	attrs = append(attrs, slog.Any("dst.addr", r.dstAddr))
	if r.hboneAddr != "" {
		attrs = append(attrs, slog.Any("dst.hbone_addr", bare(r.hboneAddr)))
	}
	str("dst.service", l.DstService)
	str("dst.workload", l.DstWorkload)
	str("dst.namespace", l.DstNamespace)
	if mtls {
		str("dst.identity", l.DstPrincipal)
	}
	str("dst.cluster", l.DstCluster)
	direction := "outbound"
	if r.inbound {
		direction = "inbound"
	}
	return append(attrs, slog.String("direction", direction))
}

// SetStart sets when the connection started, for the access log's
// duration, if before its Open.
func (r *Record) SetStart(t time.Time) { r.start = t }

// SetHBONEAddr sets the CONNECT authority the access log's close line names
// (dst.hbone_addr), for a connection that knows it only once opened.
func (r *Record) SetHBONEAddr(addr string) { r.hboneAddr = addr }

// SetFlag sets the response flag the close is recorded with.
func (r *Record) SetFlag(flag string) {
	if r.s.labels.ResponseFlags == flag {
		return
	}
	l := r.s.labels
	l.ResponseFlags = flag
	old := r.s
	r.s = r.m.seriesFor(&l)
	old.release()
}

// Fail closes a connection that failed before carrying bytes. The close
// carries the failure flag; the open was recorded with "-" as ztunnel does
// (the flag is only known at the end).
func (r *Record) Fail(flag string, err error) {
	r.SetFlag(flag)
	r.Close(0, 0, err)
}

// Close records bytes, the close, and writes the access log. requestBytes
// flowed client→server, responseBytes server→client. It takes the record
// off its ConnList, if any.
func (r *Record) Close(requestBytes, responseBytes int64, err error) {
	if r.live != nil {
		r.live.remove(r)
	}
	s := r.s
	s.received.Add(float64(requestBytes))
	s.sent.Add(float64(responseBytes))
	s.closed.Inc()
	if s.labels.ResponseFlags != FlagNone && s.labels.ResponseFlags != "" {
		s.failed.Inc()
	}
	s.release()
	// bytes_sent / bytes_recv are from the reporting ztunnel's view toward
	// its peer (SPEC §7.3).
	bytesSent, bytesRecv := requestBytes, responseBytes
	if r.inbound {
		bytesSent, bytesRecv = responseBytes, requestBytes
	}
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelError
	}
	if !r.log.Enabled(context.Background(), level) {
		return // the line's 20 attributes are not built for a logger that drops it
	}
	attrs := r.endpointAttrs(make([]slog.Attr, 0, 20))
	attrs = append(attrs,
		slog.Int64("bytes_sent", bytesSent),
		slog.Int64("bytes_recv", bytesRecv),
		slog.String("duration", durationMillis(time.Since(r.start))),
	)
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	r.log.LogAttrs(context.Background(), level, "connection complete", attrs...)
}

func durationMillis(d time.Duration) string {
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}
