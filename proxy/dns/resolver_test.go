package dns

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gozt/gozt/state"
)

// answerText renders a response as its rcode, AA bit and records, the
// records sorted (local answers are shuffled) after a leading CNAME.
func answerText(resp *dns.Msg) []string {
	out := []string{fmt.Sprintf("%s aa=%v ra=%v", dns.RcodeToString[resp.Rcode], resp.Authoritative, resp.RecursionAvailable)}
	var recs []string
	for i, rr := range resp.Answer {
		h := rr.Header()
		s := h.Name + " " + dns.Type(h.Rrtype).String() + " " + strings.TrimPrefix(rr.String(), h.String())
		if h.Rrtype == dns.TypeCNAME && i == 0 {
			out = append(out, s)
			continue
		}
		if h.Rrtype != dns.TypeTXT && h.Ttl != ttl && resp.Authoritative {
			s += fmt.Sprintf(" ttl=%d", h.Ttl)
		}
		recs = append(recs, s)
	}
	slices.Sort(recs)
	return append(out, recs...)
}

const (
	local     = "NOERROR aa=true ra=true"
	forwarded = "NOERROR aa=false ra=true"
	nxdomain  = "NXDOMAIN aa=false ra=true"
)

// queryCase is one row of TestQueries: a question and the answer text.
type queryCase struct {
	name  string
	qname string
	qtype uint16
	want  []string
}

// TestQueries runs the query table of SPEC §10.1 against a real listener,
// over UDP and TCP, from a client in ns1 and then, for the names whose
// meaning depends on the client's namespace, from a client in ns2.
func TestQueries(t *testing.T) {
	st := newTestStore(t)
	up := startUpstream(t, "127.83.0.1")
	ts := startServer(t, "127.83.0.2", st, testClient, Config{Upstreams: []netip.AddrPort{up.addr}})
	other := startServer(t, "127.83.0.13", st, otherClient, Config{Upstreams: []netip.AddrPort{up.addr}})
	runQueries(t, ts, []queryCase{
		{"fqdn A", "svc1.ns1.svc.cluster.local", dns.TypeA, []string{local, "svc1.ns1.svc.cluster.local. A 10.0.0.1"}},
		{"fqdn AAAA", "svc1.ns1.svc.cluster.local", dns.TypeAAAA, []string{local, "svc1.ns1.svc.cluster.local. AAAA fd00::1"}},
		{"upper case", "SVC1.Ns1.svc.cluster.local", dns.TypeA, []string{local, "svc1.ns1.svc.cluster.local. A 10.0.0.1"}},
		{"1 label", "svc1", dns.TypeA, []string{local, "svc1. A 10.0.0.1"}},
		{"2 labels", "svc1.ns1", dns.TypeA, []string{local, "svc1.ns1. A 10.0.0.1"}},
		{"3 labels svc", "svc1.ns1.svc", dns.TypeA, []string{local, "svc1.ns1.svc. A 10.0.0.1"}},
		{"2 labels other ns", "svc2.ns2", dns.TypeA, []string{local, "svc2.ns2. A 10.0.0.2"}},
		{"1 label other ns", "svc2", dns.TypeA, []string{nxdomain}},
		{"2 labels pod subdomain", "db-0.db", dns.TypeA, []string{local, "db-0.db. A 10.0.0.8"}},
		{"3 labels pod", "db-0.db.ns1", dns.TypeA, []string{local, "db-0.db.ns1. A 10.0.0.8"}},
		{"4 labels pod svc", "db-0.db.ns1.svc", dns.TypeA, []string{local, "db-0.db.ns1.svc. A 10.0.0.8"}},
		{"search domain on short name", "svc2.ns2.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "svc2.ns2.ns1.svc.cluster.local. CNAME svc2.ns2.", "svc2.ns2. A 10.0.0.2"}},
		{"search domain ns", "se.example.com.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "se.example.com.ns1.svc.cluster.local. CNAME se.example.com.", "se.example.com. A 10.0.0.7"}},
		{"search domain svc", "se.example.com.svc.cluster.local", dns.TypeA,
			[]string{local, "se.example.com.svc.cluster.local. CNAME se.example.com.", "se.example.com. A 10.0.0.7"}},
		{"search domain cluster", "se.example.com.cluster.local", dns.TypeA,
			[]string{local, "se.example.com.cluster.local. CNAME se.example.com.", "se.example.com. A 10.0.0.7"}},
		{"service entry host", "se.example.com", dns.TypeA, []string{local, "se.example.com. A 10.0.0.7"}},
		{"wildcard", "www.wild.example.com", dns.TypeA, []string{local, "www.wild.example.com. A 10.0.0.4"}},
		{"wildcard two deep", "a.b.wild.example.com", dns.TypeA, []string{local, "a.b.wild.example.com. A 10.0.0.4"}},
		{"wildcard via search domain has no CNAME", "www.wild.example.com.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "www.wild.example.com.ns1.svc.cluster.local. A 10.0.0.4"}},
		{"wildcard apex is not matched", "wild.example.com", dns.TypeA, []string{nxdomain}},
		{"headless A", "headless.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "headless.ns1.svc.cluster.local. A 10.1.0.1", "headless.ns1.svc.cluster.local. A 10.1.0.2"}},
		{"headless AAAA", "headless.ns1.svc.cluster.local", dns.TypeAAAA, []string{local, "headless.ns1.svc.cluster.local. AAAA fd01::1"}},
		{"headless single-stack A", "headless4.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "headless4.ns1.svc.cluster.local. A 10.1.0.1", "headless4.ns1.svc.cluster.local. A 10.1.0.2"}},
		{"headless single-stack AAAA", "headless4.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
		{"missing family", "v4only.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
		{"no VIP, not headless", "novip.example.org", dns.TypeA, []string{nxdomain}},
		{"namespace visibility", "private.ns2.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"VIPs on the client's network only", "remote.ns1.svc.cluster.local", dns.TypeA, []string{local, "remote.ns1.svc.cluster.local. A 10.0.0.10"}},
		{"client namespace wins", "multi.example.net", dns.TypeA, []string{local, "multi.example.net. A 10.0.1.1"}},
		{"canonical wins", "canon.example.net", dns.TypeA, []string{local, "canon.example.net. A 10.0.2.3"}},
		{"TXT forwarded", "svc1.ns1.svc.cluster.local", dns.TypeTXT, []string{forwarded, "svc1.ns1.svc.cluster.local. TXT \"from upstream\""}},
		{"MX forwarded", "svc1.ns1.svc.cluster.local", dns.TypeMX, []string{nxdomain}},
		{"outside name forwarded", "outside.example.com", dns.TypeA, []string{forwarded, "outside.example.com. A 192.0.2.1"}},
		{"unknown name", "nothing.example.com", dns.TypeA, []string{nxdomain}},
		// Pods of headless services by name, <pod>.<service>.<ns>.svc.<domain>
		// and its short forms, from the workloads' names as ztunnel#1918
		// (istiod sends no pod hostname or subdomain); unknown ones are
		// forwarded like any name.
		{"headless pod", "web-0.web.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.svc.cluster.local. A 10.2.0.1"}},
		{"headless pod AAAA, every address", "web-0.web.ns1.svc.cluster.local", dns.TypeAAAA,
			[]string{local, "web-0.web.ns1.svc.cluster.local. AAAA fd02::1", "web-0.web.ns1.svc.cluster.local. AAAA fd02::2"}},
		{"headless pod without the family", "web-1.web.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
		{"headless pod 2 labels", "web-0.web", dns.TypeA, []string{local, "web-0.web. A 10.2.0.1"}},
		{"headless pod 3 labels", "web-0.web.ns1", dns.TypeA, []string{local, "web-0.web.ns1. A 10.2.0.1"}},
		{"headless pod 4 labels", "web-0.web.ns1.svc", dns.TypeA, []string{local, "web-0.web.ns1.svc. A 10.2.0.1"}},
		{"headless pod 3 labels + search domain", "web-0.web.ns1.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.ns1.svc.cluster.local. CNAME web-0.web.ns1.", "web-0.web.ns1. A 10.2.0.1"}},
		{"headless pod 4 labels + search domain", "web-0.web.ns1.svc.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.svc.ns1.svc.cluster.local. CNAME web-0.web.ns1.svc.", "web-0.web.ns1.svc. A 10.2.0.1"}},
		{"headless pod upper case", "WEB-0.Web.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.svc.cluster.local. A 10.2.0.1"}},
		{"headless pod other namespace", "kafka-0.kafka.ns2.svc.cluster.local", dns.TypeA,
			[]string{local, "kafka-0.kafka.ns2.svc.cluster.local. A 10.2.2.1"}},
		{"headless pod other namespace 3 labels", "kafka-0.kafka.ns2", dns.TypeA, []string{local, "kafka-0.kafka.ns2. A 10.2.2.1"}},
		{"headless pod other namespace 2 labels", "kafka-0.kafka", dns.TypeA, []string{nxdomain}},
		{"pod of a service with a VIP", "api-0.api.ns1.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"pod of another headless service", "web-0.headless.ns1.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"headless pod in another namespace's name", "web-0.web.ns2.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"unknown headless pod", "web-9.web.ns1.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"headless service name with a pod label too many", "x.web-0.web.ns1.svc.cluster.local", dns.TypeA, []string{nxdomain}},
		{"same pod name: the client's namespace wins", "dup-0.dup.ns2.svc.cluster.local", dns.TypeA,
			[]string{local, "dup-0.dup.ns2.svc.cluster.local. A 10.2.3.1"}},
		{"same pod name: the client's cluster wins", "mc-0.mc.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "mc-0.mc.ns1.svc.cluster.local. A 10.2.4.1"}},
		{"a service of the pod's name wins", "db-0.db.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "db-0.db.ns1.svc.cluster.local. A 10.0.0.8"}},
	})
	runQueries(t, other, []queryCase{
		{"from ns2: headless pod", "web-0.web.ns1.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.svc.cluster.local. A 10.2.0.1"}},
		{"from ns2: headless pod 4 labels", "web-0.web.ns1.svc", dns.TypeA, []string{local, "web-0.web.ns1.svc. A 10.2.0.1"}},
		{"from ns2: headless pod 3 labels", "web-0.web.ns1", dns.TypeA, []string{local, "web-0.web.ns1. A 10.2.0.1"}},
		{"from ns2: headless pod 2 labels is ns2's", "web-0.web", dns.TypeA, []string{nxdomain}},
		{"from ns2: headless pod 3 labels + search domain", "web-0.web.ns1.ns2.svc.cluster.local", dns.TypeA,
			[]string{local, "web-0.web.ns1.ns2.svc.cluster.local. CNAME web-0.web.ns1.", "web-0.web.ns1. A 10.2.0.1"}},
		{"from ns2: own headless pod 2 labels", "kafka-0.kafka", dns.TypeA, []string{local, "kafka-0.kafka. A 10.2.2.1"}},
		{"from ns2: own headless pod through the search path", "kafka-0.kafka.ns2.svc.cluster.local", dns.TypeA,
			[]string{local, "kafka-0.kafka.ns2.svc.cluster.local. A 10.2.2.1"}},
		{"from ns2: same pod name: the client's namespace wins", "dup-0.dup.ns2", dns.TypeA,
			[]string{local, "dup-0.dup.ns2. A 10.2.3.2"}},
	})
}

// runQueries asks each question of ts over UDP and TCP.
func runQueries(t *testing.T, ts *testServer, cases []queryCase) {
	t.Helper()
	for _, tc := range cases {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(tc.name+"/"+network, func(t *testing.T) {
				req := question(tc.qname, tc.qtype)
				resp := ts.exchange(t, network, req)
				if diff := cmp.Diff(tc.want, answerText(resp)); diff != "" {
					t.Errorf("query %s %s (-want +got):\n%s", tc.qname, dns.Type(tc.qtype), diff)
				}
				if len(resp.Question) != 1 || resp.Question[0] != req.Question[0] {
					t.Errorf("question section %v, want %v", resp.Question, req.Question)
				}
			})
		}
	}
}

// TestLocalAnswerShape checks what the table does not: TTL 30, the RD bit
// echoed, EDNS answered with EDNS, and the order shuffled across queries.
func TestLocalAnswerShape(t *testing.T) {
	st := newTestStore(t)
	ts := startServer(t, "127.83.0.3", st, testClient, Config{})
	req := question("headless.ns1.svc.cluster.local", dns.TypeA)
	req.SetEdns0(1232, true)
	orders := map[string]bool{}
	for range 64 {
		resp := ts.exchange(t, "udp", req)
		if !resp.RecursionDesired || !resp.Authoritative || len(resp.Answer) != 2 {
			t.Fatalf("response %v: want RD, AA and two answers", resp)
		}
		for _, rr := range resp.Answer {
			if rr.Header().Ttl != 30 {
				t.Errorf("TTL %d, want 30", rr.Header().Ttl)
			}
		}
		opt := resp.IsEdns0()
		if opt == nil || opt.UDPSize() != 1232 || !opt.Do() {
			t.Fatalf("OPT %v, want payload 1232 with DO", opt)
		}
		orders[resp.Answer[0].String()] = true
	}
	if len(orders) != 2 {
		t.Errorf("64 answers all started with the same record %v; want them shuffled", orders)
	}
}

// TestRanking covers PREFERED_SERVICE_NAMESPACE and IPV6_ENABLED=false,
// which are resolver settings.
func TestRanking(t *testing.T) {
	st := newTestStore(t)
	st.Update(func(b *state.Batch) {
		for _, ns := range []string{"ns2", "ns3"} {
			if err := b.InsertService(&state.Service{Name: "pref", Namespace: ns, Hostname: "pref.example.net",
				VIPs: vip("10.0.3." + ns[2:])}); err != nil {
				t.Fatal(err)
			}
		}
	})
	plain := startServer(t, "127.83.0.4", st, testClient, Config{})
	ns3 := startServer(t, "127.83.0.5", st, testClient, Config{PreferredNamespace: "ns3"})
	ns2 := startServer(t, "127.83.0.6", st, testClient, Config{PreferredNamespace: "ns2", DisableIPv6: true})
	for _, tc := range []struct {
		name  string
		ts    *testServer
		qname string
		qtype uint16
		want  []string
	}{
		{"first without preference", plain, "pref.example.net", dns.TypeA, []string{local, "pref.example.net. A 10.0.3.2"}},
		{"preferred namespace", ns3, "pref.example.net", dns.TypeA, []string{local, "pref.example.net. A 10.0.3.3"}},
		{"canonical beats preferred", ns2, "canon.example.net", dns.TypeA, []string{local, "canon.example.net. A 10.0.2.3"}},
		{"client namespace beats preferred", ns2, "multi.example.net", dns.TypeA, []string{local, "multi.example.net. A 10.0.1.1"}},
		{"IPv6 disabled", ns2, "svc1.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
		{"IPv6 disabled headless", ns2, "headless.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
		{"IPv6 disabled headless pod", ns2, "web-0.web.ns1.svc.cluster.local", dns.TypeAAAA, []string{local}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := tc.ts.exchange(t, "udp", question(tc.qname, tc.qtype))
			if diff := cmp.Diff(tc.want, answerText(resp)); diff != "" {
				t.Errorf("query %s %s (-want +got):\n%s", tc.qname, dns.Type(tc.qtype), diff)
			}
		})
	}
}

// TestBadRequests sends raw packets: question counts other than one
// answer FORMERR, other opcodes NOTIMP, undecodable messages FORMERR, and
// an unknown source SERVFAIL. Responses get no reply at all
// (TestResponsesDropped).
func TestBadRequests(t *testing.T) {
	st := newTestStore(t)
	ts := startServer(t, "127.83.0.7", st, testClient, Config{})
	orphan := startServer(t, "127.83.0.8", st, nil, Config{})
	pack := func(edit func(m *dns.Msg)) []byte {
		m := question("svc1.ns1.svc.cluster.local", dns.TypeA)
		m.Id = 0x4242
		edit(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		to    *testServer
		pkt   []byte
		rcode int
	}{
		{"notify", ts, pack(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }), dns.RcodeNotImplemented},
		{"update", ts, pack(func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }), dns.RcodeNotImplemented},
		{"status", ts, pack(func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus }), dns.RcodeNotImplemented},
		{"no question", ts, pack(func(m *dns.Msg) { m.Question = nil }), dns.RcodeFormatError},
		{"two questions", ts, pack(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), dns.RcodeFormatError},
		{"truncated question", ts, pack(func(*dns.Msg) {})[:20], dns.RcodeFormatError},
		{"label past the end", ts, append(pack(func(m *dns.Msg) { m.Question = nil })[:5:5], 1, 0, 0, 0, 0, 0, 0, 63, 'a'), dns.RcodeFormatError},
		{"unknown source", orphan, pack(func(*dns.Msg) {}), dns.RcodeServerFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A header with a valid id; raw bytes past it.
			tc.pkt[0], tc.pkt[1] = 0x42, 0x42
			resp := exchangeRaw(t, tc.to.udp, tc.pkt)
			if resp.Id != 0x4242 || !resp.Response || resp.Rcode != tc.rcode || len(resp.Answer) != 0 {
				t.Errorf("reply id %#x response=%v rcode %s answers %d; want id 0x4242, a response, %s, no answers",
					resp.Id, resp.Response, dns.RcodeToString[resp.Rcode], len(resp.Answer), dns.RcodeToString[tc.rcode])
			}
		})
	}
}

// TestMetricsAndLog checks the istio_dns_* series and the DEBUG line of a
// local answer, a forwarded one and a failed forward.
func TestMetricsAndLog(t *testing.T) {
	st := newTestStore(t)
	up := startUpstream(t, "127.83.0.9")
	ts := startServer(t, "127.83.0.10", st, testClient, Config{Upstreams: []netip.AddrPort{up.addr}})
	ts.exchange(t, "udp", question("svc1", dns.TypeA))
	ts.exchange(t, "tcp", question("svc1", dns.TypeA))
	ts.exchange(t, "udp", question("outside.example.com", dns.TypeA))
	ts.exchange(t, "udp", question("nothing.example.com", dns.TypeAAAA))
	m := ts.srv.cfg.Resolver.cfg.Metrics
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"requests a udp", counterValue(t, m.requests.WithLabelValues("a", "udp", "client-app", "v7")), 2},
		{"requests a tcp", counterValue(t, m.requests.WithLabelValues("a", "tcp", "client-app", "v7")), 1},
		{"requests aaaa udp", counterValue(t, m.requests.WithLabelValues("aaaa", "udp", "client-app", "v7")), 1},
		{"upstream a udp", counterValue(t, m.upstreamRequests.WithLabelValues("a", "udp", "client-app", "v7")), 1},
		{"upstream aaaa udp", counterValue(t, m.upstreamRequests.WithLabelValues("aaaa", "udp", "client-app", "v7")), 1},
		{"failures a udp", counterValue(t, m.upstreamFailures.WithLabelValues("a", "udp", "client-app", "v7")), 0},
		{"failures aaaa udp (NXDOMAIN, as ztunnel)", counterValue(t, m.upstreamFailures.WithLabelValues("aaaa", "udp", "client-app", "v7")), 1},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if n := seriesCount(m.upstreamDuration); n != 2 {
		t.Errorf("istio_dns_upstream_request_duration_seconds has %d series, want 2", n)
	}
	logs := ts.logs.String()
	for _, want := range []string{
		`level=DEBUG msg="dns query" src.workload=client src.namespace=ns1 query=A domain=svc1. result=success endpoints=1`,
		`src.workload=client src.namespace=ns1 query=A domain=outside.example.com. result=forwarded endpoints=1`,
		`query=AAAA domain=nothing.example.com. result=forwarded endpoints=0`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

// TestMetricsAtZero checks that each DNS counter is exposed before any
// query, with its one all-empty series at 0, so a dashboard's rate() shows 0
// rather than no data.
func TestMetricsAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			allEmpty := true
			for _, l := range m.Label {
				allEmpty = allEmpty && l.GetValue() == ""
			}
			if m.Counter != nil && m.Counter.GetValue() == 0 && allEmpty && len(mf.Metric) == 1 {
				found[mf.GetName()] = true
			}
		}
	}
	for _, name := range []string{"istio_dns_requests_total", "istio_dns_upstream_requests_total", "istio_dns_upstream_failures_total"} {
		if !found[name] {
			t.Errorf("%s lacks its single all-empty zero series at start; found %v", name, found)
		}
	}
}

// TestLookupIP resolves as SOCKS5 does: mesh names, forwarded names, the
// client's family, and failures.
func TestLookupIP(t *testing.T) {
	st := newTestStore(t)
	up := startUpstream(t, "127.83.0.11")
	ts := startServer(t, "127.83.0.12", st, testClient, Config{Upstreams: []netip.AddrPort{up.addr}})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		v6   bool
		want string // "" for an error
	}{
		{"svc1.ns1.svc.cluster.local", false, "10.0.0.1"},
		{"svc1.ns1.svc.cluster.local", true, "fd00::1"},
		{"svc1", false, "10.0.0.1"},
		{"web-0.web.ns1", false, "10.2.0.1"}, // a headless service's pod
		{"outside.example.com", false, "192.0.2.1"},
		{"v4only.ns1.svc.cluster.local", true, ""},
		// No A record but an AAAA: an IPv4 client gets the IPv6 address
		// rather than a failure (ztunnel#2054; issue 39 item 5).
		{"v6only.ns1.svc.cluster.local", false, "fd00::6"},
		{"v6.example.com", false, "2001:db8::1"},
		{"v6.example.com", true, "2001:db8::1"},
		{"nothing.example.com", false, ""},
		{"bad name..", false, ""},
		{"", false, ""},
	} {
		got, err := ts.srv.LookupIP(ctx, tc.name, tc.v6)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("LookupIP(%q, %v) = %v, want an error", tc.name, tc.v6, got)
		case tc.want != "" && (err != nil || got != netip.MustParseAddr(tc.want)):
			t.Errorf("LookupIP(%q, %v) = %v, %v; want %s", tc.name, tc.v6, got, err, tc.want)
		}
	}
}

// counterValue returns the value of one counter series.
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// seriesCount returns the number of series c collects.
func seriesCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
