package local

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// hostnameConfig is a mesh whose services' endpoints are ServiceEntry-style
// workloads with a hostname and no IPs: ext's resolves (IPv4 and IPv6),
// gone's does not exist.
const hostnameConfig = `
workloads:` + clientWorkload + `  canonicalName: client
  canonicalRevision: v1
- uid: demo/networking.istio.io/ServiceEntry/ext/backend.example.com
  name: ext
  namespace: demo
  workloadIps: []
  hostname: backend.example.com
  services:
    demo/ext.example.com:
      80: 8080
- uid: demo/networking.istio.io/ServiceEntry/gone/gone.example.com
  name: gone
  namespace: demo
  workloadIps: []
  hostname: gone.example.com
  services:
    demo/gone.example.com:
      80: 8080
services:
- name: ext
  namespace: demo
  hostname: ext.example.com
  vips: [/{{.ExtVIP}}]
  ports:
    80: 8080
- name: gone
  namespace: demo
  hostname: gone.example.com
  vips: [/{{.GoneVIP}}]
  ports:
    80: 8080
`

// nameserver is a DNS server on port 53 of one loopback IP (resolv.conf
// names no port) that knows a fixed set of records and counts questions.
type nameserver struct {
	records map[string][]dns.RR // by "NAME TYPE"
	mu      sync.Mutex
	seen    map[string]int
}

func (ns *nameserver) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	key := q.Name + " " + dns.TypeToString[q.Qtype]
	ns.mu.Lock()
	ns.seen[key]++
	ns.mu.Unlock()
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Answer = ns.records[key]
	if resp.Answer == nil && ns.records[q.Name+" A"] == nil && ns.records[q.Name+" AAAA"] == nil {
		resp.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(resp)
}

func (ns *nameserver) count(key string) int {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.seen[key]
}

// startNameserver serves ns on ip:53 (UDP and TCP) until the test ends.
// When port 53 cannot be bound (not root) it skips the test, or fails it
// under GOZT_REQUIRE_ROOT=1, as CI runs.
func startNameserver(t *testing.T, ip string, ns *nameserver) {
	t.Helper()
	ns.seen = map[string]int{}
	cannot := func(err error) {
		t.Helper()
		if os.Getenv("GOZT_REQUIRE_ROOT") == "1" {
			t.Fatalf("cannot bind a nameserver on %s:53 (root needed): %v", ip, err)
		}
		t.Skipf("cannot bind a nameserver on %s:53: %v", ip, err)
	}
	pc, err := net.ListenPacket("udp", ip+":53")
	if err != nil {
		cannot(err)
	}
	l, err := net.Listen("tcp", ip+":53")
	if err != nil {
		pc.Close()
		cannot(err)
	}
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: dns.HandlerFunc(ns.serveDNS)},
		{Listener: l, Handler: dns.HandlerFunc(ns.serveDNS)},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { srv.Shutdown(); <-done })
	}
}

// TestHostnameEndpoint: a service whose endpoint has a hostname and no IPs
// (SPEC §3.3) is reached at the address gozt's resolv.conf nameserver
// gives, of the client's family although the answer also has an IPv6
// address; the answer is cached for its TTL; a name that does not resolve
// fails the connection with ztunnel's log lines and no traffic metrics;
// istio_on_demand_dns_total counts every lookup, from 0 at start-up.
func TestHostnameEndpoint(t *testing.T) {
	const (
		client  = "127.89.202.2"
		backIP  = "127.89.202.5"
		dnsIP   = "127.89.202.53"
		extVIP  = "127.89.202.100"
		goneVIP = "127.89.202.101"
	)
	ns := &nameserver{records: map[string][]dns.RR{
		"backend.example.com. A": {&dns.A{Hdr: dns.RR_Header{Name: "backend.example.com.", Rrtype: dns.TypeA,
			Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(backIP)}},
		// Unreachable here: a pick of the wrong family fails the connection.
		"backend.example.com. AAAA": {&dns.AAAA{Hdr: dns.RR_Header{Name: "backend.example.com.", Rrtype: dns.TypeAAAA,
			Class: dns.ClassINET, Ttl: 300}, AAAA: net.ParseIP("2001:db8::5")}},
	}}
	startNameserver(t, dnsIP, ns)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+dnsIP+"\noptions timeout:2 attempts:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := struct{ Client, ExtVIP, GoneVIP string }{client, extVIP, goneVIP}
	m, logs := startConfig(t, hostnameConfig, data, Options{ResolvConf: rc})
	tm := &testMesh{Mesh: m, ips: meshIPs{Client: client}, logs: logs}
	metricsURL := "http://" + m.MetricsAddr().String() + "/metrics"
	if metrics := httpGet(t, metricsURL); metricValue(metrics, "istio_on_demand_dns_total", `hostname=""`) != 0 {
		t.Errorf("istio_on_demand_dns_total does not read 0 at start-up:\n%s", grepLines(metrics, "on_demand"))
	}

	b := listenBackend(t, backIP+":8080", echoHandler)
	const n = 8
	for range n {
		c := tm.socksDial(t, extVIP+":80")
		roundTrip(t, c)
		c.Close()
	}
	if got := len(b.accepted()); got != n {
		t.Errorf("backend at the resolved IPv4 address accepted %d connections, want %d", got, n)
	}
	if q := ns.count("backend.example.com. A"); q != 1 {
		t.Errorf("nameserver got %d A queries for %d connections, want 1 (cached for the 300s TTL)", q, n)
	}

	c := tm.socksDial(t, goneVIP+":80")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("ping"))
	// Closed at once: EOF, or a reset since "ping" was never read.
	if got, err := io.ReadAll(c); len(got) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection to an unresolvable endpoint read %q, %v; want it closed", got, err)
	}
	c.Close()
	waitLog(t, tm, "dns lookup failed")
	waitLog(t, tm, "no ip addresses were resolved for workload: demo/networking.istio.io/ServiceEntry/gone/gone.example.com")
	if !strings.Contains(logs.String(), "hostname=gone.example.com") {
		t.Errorf("the failed lookup's log line does not name the hostname:\n%s", logs)
	}

	metrics := httpGet(t, metricsURL)
	src := []string{`source_workload="client"`, `source_canonical_service="client"`, `source_canonical_revision="v1"`,
		`source_workload_namespace="demo"`, `source_principal="spiffe://cluster.local/ns/demo/sa/client"`,
		`source_app="client"`, `source_version="v1"`, `source_cluster="unknown"`}
	if got := metricValue(metrics, "istio_on_demand_dns_total", append(src, `hostname="backend.example.com"`)...); got != n {
		t.Errorf("istio_on_demand_dns_total{hostname=backend.example.com} = %v, want %d\n%s", got, n, grepLines(metrics, "on_demand"))
	}
	if got := metricValue(metrics, "istio_on_demand_dns_total", append(src, `hostname="gone.example.com"`)...); got != 1 {
		t.Errorf("istio_on_demand_dns_total{hostname=gone.example.com} = %v, want 1\n%s", got, grepLines(metrics, "on_demand"))
	}
	if got := metricValue(metrics, "istio_tcp_connections_opened_total", `destination_workload="ext"`); got != n {
		t.Errorf("istio_tcp_connections_opened_total{destination_workload=ext} = %v, want %d", got, n)
	}
	if got := metricValue(metrics, "istio_tcp_connections_opened_total", `destination_workload="gone"`); got != -1 {
		t.Errorf("istio_tcp_connections_opened_total{destination_workload=gone} = %v, want no series (ztunnel's early deny)", got)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
