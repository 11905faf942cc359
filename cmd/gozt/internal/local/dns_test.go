package local

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestDNSResolvesMeshNames: each workload's DNS proxy on its own IP:15053
// answers the service's full name, its namespace-qualified name and its
// short name with the VIP, over UDP and TCP; AAAA has no records (NOERROR);
// SOCKS5 resolves a domain target through it; the queries are counted.
func TestDNSResolvesMeshNames(t *testing.T) {
	tm := startMesh(t)
	for _, ip := range []string{tm.ips.Client, tm.ips.Server} {
		for _, name := range []string{"echo.demo.svc.cluster.local", "echo.demo", "echo"} {
			for _, network := range []string{"udp", "tcp"} {
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(name), dns.TypeA)
				c := &dns.Client{Net: network, Timeout: 5 * time.Second}
				resp, _, err := c.Exchange(m, net.JoinHostPort(ip, "15053"))
				if err != nil {
					t.Fatalf("%s %s @%s: %v", network, name, ip, err)
				}
				if len(resp.Answer) != 1 || resp.Rcode != dns.RcodeSuccess || !resp.Authoritative {
					t.Fatalf("%s %s @%s: %v; want one authoritative answer", network, name, ip, resp)
				}
				if a, ok := resp.Answer[0].(*dns.A); !ok || a.A.String() != tm.vip || a.Hdr.Name != dns.Fqdn(name) {
					t.Errorf("%s %s @%s: answer %v, want %s A %s", network, name, ip, resp.Answer[0], dns.Fqdn(name), tm.vip)
				}
			}
		}
	}
	m := new(dns.Msg)
	m.SetQuestion("echo.demo.svc.cluster.local.", dns.TypeAAAA)
	resp, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, net.JoinHostPort(tm.ips.Client, "15053"))
	if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("AAAA for a v4-only service = %v, %v; want NOERROR without records", resp, err)
	}

	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	listenBackend(t, tm.ips.Server2+":8080", echoHandler)
	for _, name := range []string{"echo.demo.svc.cluster.local:80", "echo:80"} {
		c := tm.socksDial(t, name)
		roundTrip(t, c)
		c.Close()
	}

	metrics := httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics")
	if got := metricValue(metrics, "istio_dns_requests_total", `request_query_type="a"`, `request_protocol="tcp"`,
		`source_canonical_service="client"`); got != 3 {
		t.Errorf("istio_dns_requests_total{a,tcp,client} = %v, want 3\n%s", got, metrics)
	}
}

// TestDNSBanner: the start-up banner lists each workload's DNS address.
func TestDNSBanner(t *testing.T) {
	ip := "127.83.9.2"
	cfg := `workloads:
- uid: Kubernetes//Pod/demo/w
  name: w
  namespace: demo
  workloadIps: [` + ip + `]
  protocol: HBONE
`
	path := writeConfig(t, cfg)
	var out bytes.Buffer
	m, err := Start(context.Background(), Options{ConfigPath: path, AdminAddr: "127.0.0.1:0",
		MetricsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0", Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	if want := "dns       " + ip + ":15053 (udp+tcp)"; !strings.Contains(out.String(), want) {
		t.Errorf("banner lacks %q:\n%s", want, out.String())
	}
}
