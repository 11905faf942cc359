package telemetry

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// open records a connection whose addresses are not known as opened.
func (m *Metrics) open(log *slog.Logger, l Labels, inbound bool) *Record {
	return m.Open(log, l, inbound, netip.AddrPort{}, netip.AddrPort{}, "")
}

// TestConnRecordSeries checks that connections with one label set share a
// series, that a changed response flag moves the close to another series,
// and that the counters and the access log carry the right values.
func TestConnRecordSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))

	l := Labels{Reporter: "destination", ResponseFlags: FlagNone, SecurityPolicy: SecurityMutualTLS,
		SrcWorkload: "client", SrcNamespace: "demo", SrcPrincipal: "spiffe://cluster.local/ns/demo/sa/client",
		DstWorkload: "echo", DstNamespace: "demo"}
	a := m.open(log, l, true)
	b := m.open(log, l, true)
	if a.s != b.s {
		t.Fatal("two connections with the same labels got different series")
	}
	a.srcAddr = netip.MustParseAddrPort("10.0.0.1:40000")
	a.dstAddr = netip.MustParseAddrPort("10.0.0.2:8080")
	a.Close(100, 7, nil)
	b.SetFlag(FlagDeny)
	if b.s == a.s || b.s.labels.ResponseFlags != FlagDeny || a.s.labels.ResponseFlags != FlagNone {
		t.Fatalf("setFlag: series flags a=%q b=%q", a.s.labels.ResponseFlags, b.s.labels.ResponseFlags)
	}
	b.Close(0, 0, errors.New("denied"))

	ok, deny := l.values(), l
	deny.ResponseFlags = FlagDeny
	denied := deny.values()
	for _, tc := range []struct {
		vec    *prometheus.CounterVec
		values []string
		want   float64
	}{
		{m.opened, ok, 2},
		{m.closed, ok, 1},
		{m.closed, denied, 1},
		{m.failed, ok, 0},
		{m.failed, denied, 1},
		{m.received, ok, 100},
		{m.sent, ok, 7},
	} {
		if got := counterValue(t, tc.vec.WithLabelValues(tc.values...)); got != tc.want {
			t.Errorf("%v flags=%s: got %v, want %v", tc.vec, tc.values[21], got, tc.want)
		}
	}
	out := logBuf.String()
	for _, want := range []string{"src.addr=10.0.0.1:40000", "dst.addr=10.0.0.2:8080", "bytes_sent=7", "bytes_recv=100",
		"src.identity=spiffe://cluster.local/ns/demo/sa/client", "level=ERROR", "error=denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("access log lacks %q:\n%s", want, out)
		}
	}
}

// TestConnRecordSmall guards the per-connection cost that gozt bench's
// idle-memory scenario measures: a record must not carry the label values.
func TestConnRecordSmall(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	l := Labels{Reporter: "source", ResponseFlags: FlagNone}
	m.open(slog.New(slog.DiscardHandler), l, false) // resolve the series once
	allocs := testing.AllocsPerRun(100, func() {
		m.open(slog.New(slog.DiscardHandler), l, false)
	})
	if allocs > 2 {
		t.Errorf("open allocates %v times per connection with a known series, want ≤ 2", allocs)
	}
}

// TestConnRecordCloseWithoutAccessLog: closing a record whose access log
// drops the "connection complete" line (gozt bench's proxies, or an
// operator's level above it) builds none of its attributes: no allocation,
// where building them took several per connection.
func TestConnRecordCloseWithoutAccessLog(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	l := Labels{Reporter: "source", ResponseFlags: FlagNone, SrcWorkload: "client", SrcNamespace: "demo"}
	log := slog.New(slog.DiscardHandler)
	src, dst := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:8080")
	m.Open(log, l, false, src, dst, "10.0.0.2:15008").Close(1, 1, nil) // resolve the series once
	recs := make([]*Record, 0, 101)
	for range 101 {
		recs = append(recs, m.Open(log, l, false, src, dst, "10.0.0.2:15008"))
	}
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		recs[i].Close(7, 100, nil)
		i++
	})
	if allocs != 0 {
		t.Errorf("close allocates %v times per connection with the access log off, want 0", allocs)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestEmptySeriesNeverCounted: every traffic counter has its all-empty
// series at 0 from NewMetrics, so an unfiltered dashboard sum reads 0
// before any traffic; a connection whose labels are all missing still lands
// in its own "unknown" series, never in the empty one.
func TestEmptySeriesNeverCounted(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	families := func() map[string]*dto.MetricFamily {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := make(map[string]*dto.MetricFamily)
		for _, mf := range mfs {
			byName[mf.GetName()] = mf
		}
		return byName
	}
	counters := []string{
		"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total",
		"istio_tcp_connections_failed_total", "istio_tcp_received_bytes_total", "istio_tcp_sent_bytes_total",
	}
	for _, name := range counters {
		mf := families()[name]
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%s before traffic has %d series, want 1 (the empty one)", name, len(mf.GetMetric()))
		}
	}

	r := m.open(slog.New(slog.DiscardHandler), Labels{}, false)
	r.Fail(FlagConnect, errors.New("refused"))
	r = m.open(slog.New(slog.DiscardHandler), Labels{}, true)
	r.Close(10, 20, nil)

	got := families()
	for _, name := range counters {
		var empty, other int
		for _, s := range got[name].GetMetric() {
			allEmpty := true
			for _, lp := range s.GetLabel() {
				allEmpty = allEmpty && lp.GetValue() == ""
			}
			if !allEmpty {
				other++
				continue
			}
			empty++
			if v := s.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s empty series = %v after traffic, want 0", name, v)
			}
		}
		if empty != 1 || other == 0 {
			t.Errorf("%s: %d empty series and %d others after traffic, want 1 and some", name, empty, other)
		}
	}
}

// TestAccessLogFields (SPEC §7.3): "connection opened" at DEBUG and
// "connection complete" carry ztunnel's fields in its order, clusters
// included; a field gozt has no value for is left out, not logged empty;
// identities only for mTLS; addresses are values that print bare.
func TestAccessLogFields(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := NewMetrics(prometheus.NewRegistry())
	l := Labels{Reporter: "source", SrcWorkload: "client", SrcNamespace: "demo", SrcCluster: "c1",
		SrcPrincipal: "spiffe://td/ns/demo/sa/client", DstWorkload: "server", DstCluster: "c2",
		DstPrincipal: "spiffe://td/ns/demo/sa/server", SecurityPolicy: SecurityMutualTLS, ResponseFlags: FlagNone}
	r := m.Open(log, l, false, netip.MustParseAddrPort("10.0.0.1:1234"), netip.MustParseAddrPort("10.0.0.2:15008"), "10.0.0.2:80")
	r.Close(3, 5, nil)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log lines:\n%s", &buf)
	}
	ends := `src.addr=10.0.0.1:1234 src.workload=client src.namespace=demo src.identity=spiffe://td/ns/demo/sa/client src.cluster=c1 ` +
		`dst.addr=10.0.0.2:15008 dst.hbone_addr=10.0.0.2:80 dst.workload=server dst.identity=spiffe://td/ns/demo/sa/server dst.cluster=c2 direction=outbound`
	if !strings.Contains(lines[0], "level=DEBUG msg=\"connection opened\" "+ends) {
		t.Errorf("opened line:\n%s\nwant it to end with\n%s", lines[0], ends)
	}
	if !strings.Contains(lines[1], "level=INFO msg=\"connection complete\" "+ends+" bytes_sent=3 bytes_recv=5 duration=") {
		t.Errorf("complete line:\n%s\nwant the fields\n%s", lines[1], ends)
	}
	for _, absent := range []string{"dst.service=", "dst.namespace=", `=""`} {
		if strings.Contains(buf.String(), absent) {
			t.Errorf("log has %q, want fields without a value left out:\n%s", absent, &buf)
		}
	}
	// Without mTLS, no identities.
	buf.Reset()
	l.SecurityPolicy = SecurityUnknown
	m.Open(log, l, true, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:80"), "").Close(0, 0, nil)
	if strings.Contains(buf.String(), "identity") || !strings.Contains(buf.String(), "direction=inbound") {
		t.Errorf("plaintext log:\n%s", &buf)
	}
}
