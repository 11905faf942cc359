package node

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	xproxy "golang.org/x/net/proxy"
	"istio.io/istio/pkg/workloadapi"
)

// TestDedicatedDNS: dedicated mode runs the DNS proxy unless DNS_CAPTURE
// says otherwise (on the test's bind IP instead of 127.0.0.1), answering
// the workload's mesh names and resolving SOCKS5 domain targets; with
// ISTIO_META_DNS_CAPTURE=false nothing listens on 15053, SOCKS5 refuses a
// domain target, and istio_dns_requests_total still reads 0.
func TestDedicatedDNS(t *testing.T) {
	cp := newControlPlane(t)
	on, off := "127.83.3.2", "127.83.3.3"
	cp.startNode(t, "client", on)
	offNode := cp.startNodeEnv(t, "other", off, "ISTIO_META_DNS_CAPTURE=false")
	vip := netip.MustParseAddr("10.96.0.10").As4()
	cp.xds.PushService(&workloadapi.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: vip[:]}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	})
	cp.xds.PushWorkload(workload("client", on), workload("other", off))

	query := func(network, name string) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		resp, _, err := (&dns.Client{Net: network, Timeout: 5 * time.Second}).Exchange(m, on+":15053")
		return resp, err
	}
	// xDS delivers the service asynchronously; until then the name is
	// forwarded upstream.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := query("udp", "echo.demo.svc.cluster.local")
		if err == nil && len(resp.Answer) == 1 && resp.Authoritative {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no local answer for echo.demo.svc.cluster.local: %v, %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, name := range []string{"echo", "echo.demo", "echo.demo.svc.cluster.local"} {
			resp, err := query(network, name)
			if err != nil {
				t.Fatalf("%s %s: %v", network, name, err)
			}
			if len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "10.96.0.10" {
				t.Errorf("%s %s: %v, want A 10.96.0.10", network, name, resp)
			}
		}
	}

	if c, err := net.DialTimeout("tcp", off+":15053", 5*time.Second); err == nil {
		c.Close()
		t.Errorf("DNS_CAPTURE=false: something listens on %s:15053", off)
	}
	d, _ := xproxy.SOCKS5("tcp", off+":15080", nil, xproxy.Direct)
	if c, err := d.Dial("tcp", "echo.demo.svc.cluster.local:80"); err == nil {
		c.Close()
		t.Errorf("DNS_CAPTURE=false: SOCKS5 accepted a domain target")
	} else if !strings.Contains(err.Error(), "command not supported") {
		t.Errorf("DNS_CAPTURE=false: SOCKS5 domain target failed with %v, want command not supported", err)
	}
	metrics := get(t, "http://"+offNode.MetricsAddr().String()+"/metrics")
	if !strings.Contains(metrics, "\nistio_dns_requests_total{request_protocol=\"\",request_query_type=\"\",source_canonical_revision=\"\",source_canonical_service=\"\"} 0\n") {
		t.Errorf("DNS_CAPTURE=false: /metrics lacks istio_dns_requests_total at 0:\n%s", metrics)
	}
}
