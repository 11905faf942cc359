package dns

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/internal/dnstest"
	"github.com/gozt/gozt/internal/syncbuf"
	"github.com/gozt/gozt/state"
)

// The client workload of the fixture mesh.
var testClient = &state.Workload{
	UID: "Kubernetes//Pod/ns1/client", Name: "client", Namespace: "ns1",
	Addresses: []netip.Addr{netip.MustParseAddr("10.9.0.1")}, CanonicalName: "client-app", CanonicalRevision: "v7",
}

// otherClient is a client in ns2, for names as another namespace sees them.
var otherClient = &state.Workload{
	UID: "Kubernetes//Pod/ns2/other", Name: "other", Namespace: "ns2",
	Addresses: []netip.Addr{netip.MustParseAddr("10.9.0.2")},
}

// member returns a workload in ns named name with addrs, an endpoint of
// the services keyed in svcs ("namespace/hostname").
func member(uid, ns, name string, addrs []string, svcs ...string) *state.Workload {
	w := &state.Workload{UID: uid, Name: name, Namespace: ns, Services: map[string]state.PortMap{}}
	for _, a := range addrs {
		w.Addresses = append(w.Addresses, netip.MustParseAddr(a))
	}
	for _, key := range svcs {
		w.Services[key] = state.PortMap{80: 80}
	}
	return w
}

func vip(ip string) []state.NetworkAddress {
	return []state.NetworkAddress{{Address: netip.MustParseAddr(ip)}}
}

func vips(ips ...string) []state.NetworkAddress {
	var out []state.NetworkAddress
	for _, ip := range ips {
		out = append(out, vip(ip)...)
	}
	return out
}

// newTestStore returns the fixture mesh: services in the client's
// namespace ns1 and in ns2/ns3, a wildcard, a ServiceEntry host, headless
// services with endpoints, and services the DNS proxy must not answer.
func newTestStore(t testing.TB) *state.Store {
	t.Helper()
	svcs := []*state.Service{
		{Name: "svc1", Namespace: "ns1", Hostname: "svc1.ns1.svc.cluster.local", VIPs: vips("10.0.0.1", "fd00::1")},
		{Name: "svc2", Namespace: "ns2", Hostname: "svc2.ns2.svc.cluster.local", VIPs: vip("10.0.0.2")},
		{Name: "private", Namespace: "ns2", Hostname: "private.ns2.svc.cluster.local", VIPs: vip("10.0.0.3"),
			Visibility: state.VisibilityNamespace},
		{Name: "wild", Namespace: "ns1", Hostname: "*.wild.example.com", VIPs: vip("10.0.0.4")},
		{Name: "headless", Namespace: "ns1", Hostname: "headless.ns1.svc.cluster.local"},
		{Name: "headless4", Namespace: "ns1", Hostname: "headless4.ns1.svc.cluster.local", IPFamilies: state.FamiliesIPv4Only},
		{Name: "v4only", Namespace: "ns1", Hostname: "v4only.ns1.svc.cluster.local", VIPs: vip("10.0.0.6")},
		{Name: "v6only", Namespace: "ns1", Hostname: "v6only.ns1.svc.cluster.local", VIPs: vip("fd00::6")},
		{Name: "se", Namespace: "ns1", Hostname: "se.example.com", VIPs: vip("10.0.0.7")},
		{Name: "novip", Namespace: "ns1", Hostname: "novip.example.org"},
		{Name: "pod", Namespace: "ns1", Hostname: "db-0.db.ns1.svc.cluster.local", VIPs: vip("10.0.0.8")},
		{Name: "remote", Namespace: "ns1", Hostname: "remote.ns1.svc.cluster.local", VIPs: []state.NetworkAddress{
			{Network: "nw2", Address: netip.MustParseAddr("10.0.0.9")}, {Address: netip.MustParseAddr("10.0.0.10")}}},
		// One hostname in three namespaces: ns1's wins for ns1 clients.
		{Name: "multi", Namespace: "ns1", Hostname: "multi.example.net", VIPs: vip("10.0.1.1")},
		{Name: "multi", Namespace: "ns2", Hostname: "multi.example.net", VIPs: vip("10.0.1.2")},
		// Canonical beats first for a hostname without an ns1 service.
		{Name: "canon", Namespace: "ns2", Hostname: "canon.example.net", VIPs: vip("10.0.2.2")},
		{Name: "canon", Namespace: "ns3", Hostname: "canon.example.net", VIPs: vip("10.0.2.3"), Canonical: true},
		// Services whose pods have names of their own (pod.service.ns...)
		// when headless: web and mc in ns1, kafka and dup in ns2; api has
		// a VIP. dup's hostname is also a ServiceEntry's in ns1, without
		// addresses (headless, by its name).
		{Name: "web", Namespace: "ns1", Hostname: "web.ns1.svc.cluster.local"},
		{Name: "mc", Namespace: "ns1", Hostname: "mc.ns1.svc.cluster.local"},
		{Name: "api", Namespace: "ns1", Hostname: "api.ns1.svc.cluster.local", VIPs: vip("10.0.0.11")},
		{Name: "kafka", Namespace: "ns2", Hostname: "kafka.ns2.svc.cluster.local"},
		{Name: "dup", Namespace: "ns2", Hostname: "dup.ns2.svc.cluster.local"},
		{Name: "dup-se", Namespace: "ns1", Hostname: "dup.ns2.svc.cluster.local"},
	}
	eps := []*state.Workload{
		{UID: "Kubernetes//Pod/ns1/h1", Name: "h1", Namespace: "ns1",
			Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd01::1")},
			Services:  map[string]state.PortMap{"ns1/headless.ns1.svc.cluster.local": {80: 80}, "ns1/headless4.ns1.svc.cluster.local": {80: 80}}},
		{UID: "Kubernetes//Pod/ns1/h2", Name: "h2", Namespace: "ns1",
			Addresses: []netip.Addr{netip.MustParseAddr("10.1.0.2")},
			Services:  map[string]state.PortMap{"ns1/headless.ns1.svc.cluster.local": {80: 80}, "ns1/headless4.ns1.svc.cluster.local": {80: 80}}},
		{UID: "Kubernetes//Pod/ns1/h3", Name: "h3", Namespace: "ns1",
			Addresses: []netip.Addr{netip.MustParseAddr("fd01::3")},
			Services:  map[string]state.PortMap{"ns1/headless4.ns1.svc.cluster.local": {80: 80}}},
		member("Kubernetes//Pod/ns1/web-0", "ns1", "web-0", []string{"10.2.0.1", "fd02::1", "fd02::2"}, "ns1/web.ns1.svc.cluster.local"),
		member("Kubernetes//Pod/ns1/web-1", "ns1", "web-1", []string{"10.2.0.2"}, "ns1/web.ns1.svc.cluster.local"),
		member("Kubernetes//Pod/ns1/api-0", "ns1", "api-0", []string{"10.2.1.1"}, "ns1/api.ns1.svc.cluster.local"),
		member("Kubernetes//Pod/ns2/kafka-0", "ns2", "kafka-0", []string{"10.2.2.1"}, "ns2/kafka.ns2.svc.cluster.local"),
		// Two dup-0 in different namespaces, ns2's first by uid.
		member("Kubernetes//Pod/ns2/dup-0", "ns2", "dup-0", []string{"10.2.3.2"}, "ns2/dup.ns2.svc.cluster.local"),
		member("Kubernetes/networking.istio.io/WorkloadEntry/ns1/dup-0", "ns1", "dup-0", []string{"10.2.3.1"},
			"ns1/dup.ns2.svc.cluster.local"),
		// Two mc-0 in ns1, another cluster's first by uid.
		clustered(member("East//Pod/ns1/mc-0", "ns1", "mc-0", []string{"10.2.4.2"}, "ns1/mc.ns1.svc.cluster.local"), "East"),
		member("Kubernetes//Pod/ns1/mc-0", "ns1", "mc-0", []string{"10.2.4.1"}, "ns1/mc.ns1.svc.cluster.local"),
	}
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		for _, s := range svcs {
			if err := b.InsertService(s); err != nil {
				t.Fatalf("InsertService(%s): %v", s.Key(), err)
			}
		}
		for _, w := range append(eps, testClient) {
			if err := b.InsertWorkload(w); err != nil {
				t.Fatalf("InsertWorkload(%s): %v", w.UID, err)
			}
		}
	})
	return st
}

// clustered returns w in cluster.
func clustered(w *state.Workload, cluster string) *state.Workload {
	w.ClusterID = cluster
	return w
}

// questions counts the questions a test DNS server is asked, by key.
type questions struct {
	mu   sync.Mutex
	seen map[string]int // key → questions
}

// ask counts one question under key.
func (qs *questions) ask(key string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.seen == nil {
		qs.seen = map[string]int{}
	}
	qs.seen[key]++
}

// count returns how many questions were asked under key.
func (qs *questions) count(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.seen[key]
}

// upstream is a test DNS server on loopback, UDP and TCP on one port. Its
// questions are counted by "udp NAME" / "tcp NAME".
type upstream struct {
	addr netip.AddrPort
	questions
}

// upstreamHandler answers like a recursive resolver that knows a few
// names: outside.example.com A 192.0.2.1, v6.example.com AAAA 2001:db8::1
// (and no A), TXT records for any name, and big.example.com (50 A records,
// truncated over UDP); NXDOMAIN otherwise.
func (u *upstream) handler(network string) dns.HandlerFunc {
	return func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		u.ask(network + " " + q.Name)
		resp := new(dns.Msg)
		resp.SetReply(req)
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 60}
		switch {
		case q.Qtype == dns.TypeTXT:
			resp.Answer = append(resp.Answer, &dns.TXT{Hdr: hdr, Txt: []string{"from upstream"}})
		case q.Name == "outside.example.com." && q.Qtype == dns.TypeA:
			resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, 1)})
		case q.Name == "v6.example.com." && q.Qtype == dns.TypeAAAA:
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("2001:db8::1")})
		case q.Name == "v6.example.com.":
			// The name exists without an address of this type: NOERROR,
			// no answer.
		case q.Name == "big.example.com." && network == "udp":
			resp.Truncated = true
		case q.Name == "big.example.com.":
			for i := range 50 {
				resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, byte(i+1))})
			}
		default:
			resp.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(resp)
	}
}

// listenPair binds a UDP socket on ip and a TCP listener on the same port.
func listenPair(t testing.TB, ip string) (net.PacketConn, net.Listener) {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	return pc, l
}

// startUpstream runs an upstream on ip until the test ends.
func startUpstream(t testing.TB, ip string) *upstream {
	t.Helper()
	u := &upstream{}
	pc, l := listenPair(t, ip)
	u.addr = netip.MustParseAddrPort(pc.LocalAddr().String())
	dnstest.Serve(t, &dns.Server{PacketConn: pc, Handler: u.handler("udp")})
	dnstest.Serve(t, &dns.Server{Listener: l, Handler: u.handler("tcp")})
	return u
}

// testServer is a DNS proxy for testClient on a loopback address.
type testServer struct {
	srv      *Server
	udp, tcp string
	reg      *prometheus.Registry
	logs     *syncbuf.Buffer
}

// startServer serves the fixture mesh on ip as testClient (or as an
// unknown source if client is nil), forwarding to cfg.Upstreams.
func startServer(t testing.TB, ip string, st *state.Store, client *state.Workload, cfg Config) *testServer {
	t.Helper()
	ts := &testServer{reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}}
	cfg.Metrics = NewMetrics(ts.reg)
	cfg.Logger = slog.New(slog.NewTextHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts.srv = NewServer(ServerConfig{
		Resolver: NewResolver(cfg),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), client
		},
		Addrs: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr(ip), 0)},
	})
	if err := ts.srv.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ts.srv.Serve() }()
	t.Cleanup(func() {
		if err := ts.srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	udp, tcp := ts.srv.Addrs()
	ts.udp, ts.tcp = udp[0].String(), tcp[0].String()
	return ts
}

// exchange sends one query over network and fails t if no answer comes.
func (ts *testServer) exchange(t testing.TB, network string, req *dns.Msg) *dns.Msg {
	t.Helper()
	addr := ts.udp
	if network == "tcp" {
		addr = ts.tcp
	}
	c := &dns.Client{Net: network}
	resp, _, err := c.Exchange(req, addr)
	if err != nil {
		t.Fatalf("exchange %s %v: %v", network, req.Question, err)
	}
	return resp
}

func question(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return m
}
