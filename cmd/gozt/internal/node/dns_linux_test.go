package node

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/internal/dnstest"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
)

// podResolver is a DNS server inside a pod that knows one outside name and
// records the source of every query it gets.
type podResolver struct {
	mu      sync.Mutex
	queries []string // "SRC NAME"
}

func (r *podResolver) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.queries...)
}

// startPodResolver serves DNS on p's IP, port 53, UDP and TCP.
func startPodResolver(t *testing.T, p pod) *podResolver {
	t.Helper()
	r := &podResolver{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		src, _, _ := net.SplitHostPort(w.RemoteAddr().String())
		r.mu.Lock()
		r.queries = append(r.queries, src+" "+req.Question[0].Name)
		r.mu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(req)
		if req.Question[0].Name == "outside.example.com." && req.Question[0].Qtype == dns.TypeA {
			resp.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "outside.example.com.", Rrtype: dns.TypeA,
				Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}}
		} else {
			resp.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(resp)
	})
	var pc net.PacketConn
	var l net.Listener
	inPod(t, p, func() (err error) {
		if pc, err = net.ListenPacket("udp", p.ip+":53"); err != nil {
			return err
		}
		l, err = net.Listen("tcp", p.ip+":53")
		return err
	})
	dnstest.Serve(t, &dns.Server{PacketConn: pc, Handler: handler})
	dnstest.Serve(t, &dns.Server{Listener: l, Handler: handler})
	return r
}

// startSharedDNS is startShared with the DNS proxy's upstream read from a
// resolv.conf naming resolver.
func (cp *controlPlane) startSharedDNS(t *testing.T, name, resolver string) *sharedNode {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "ztunnel.sock")
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver "+resolver+"\noptions timeout:2 attempts:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cni := inpodtest.NewServer(t, sock)
	root := string(cp.ca.RootPEM())
	env, err := envconfig.Load([]string{
		"NODE_NAME=" + name, "INPOD_UDS=" + sock,
		"XDS_ADDRESS=https://" + cp.xds.Addr(), "CA_ADDRESS=https://" + cp.cas.Addr(),
		"XDS_ROOT_CA=" + root, "CA_ROOT_CA=" + root, "AUTH_TOKEN=node-token",
	})
	if err != nil {
		t.Fatal(err)
	}
	return runShared(t, name, cni, Options{Env: env, AdminAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		ReadinessAddr: "127.0.0.1:0", ResolvConf: rc})
}

// queryFrom sends one query from inside pod p to addr over network.
func queryFrom(t *testing.T, p pod, network, addr, name string) (*dns.Msg, error) {
	t.Helper()
	var conn net.Conn
	inPod(t, p, func() (err error) {
		conn, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	resp, _, err := c.ExchangeWithConn(m, &dns.Conn{Conn: conn})
	return resp, err
}

// TestSharedModeDNS: in a captured pod, where istio-cni's rules redirect
// UDP and TCP port 53 to 15053, a query to the pod's nameserver is
// answered by gozt's DNS proxy inside the pod's namespace: a mesh name
// (short or full) with the service VIP, without reaching the nameserver;
// an outside name forwarded to it from the pod's own IP, with the mark
// that keeps the forwarded query from being redirected again.
func TestSharedModeDNS(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	a := m.pod(1, 2, true)
	ns := m.pod(1, 3, false) // the cluster's DNS server, not in the mesh
	resolver := startPodResolver(t, ns)

	cp := newControlPlane(t)
	n1 := cp.startSharedDNS(t, "node1", ns.ip)
	vip := netip.MustParseAddr("10.96.0.10").As4()
	cp.xds.PushService(&workloadapi.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: vip[:]}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	})
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"))
	n1.add(t, "uid-a", a, "a")
	n1.snapshotSent(t)
	eventually(t, 10*time.Second, "node1 ready", func() bool { return strings.HasPrefix(n1.readiness(t), "ready") })

	server := ns.ip + ":53"
	for _, network := range []string{"udp", "tcp"} {
		// xDS may still be delivering the service: until then the name
		// goes upstream and is unknown there.
		eventually(t, 10*time.Second, network+" mesh name answered in the pod", func() bool {
			resp, err := queryFrom(t, a, network, server, "echo.demo.svc.cluster.local")
			return err == nil && len(resp.Answer) == 1 && resp.Authoritative
		})
		for _, name := range []string{"echo", "echo.demo", "echo.demo.svc.cluster.local"} {
			resp, err := queryFrom(t, a, network, server, name)
			if err != nil {
				t.Fatalf("%s %s: %v", network, name, err)
			}
			if len(resp.Answer) != 1 || !resp.Authoritative {
				t.Fatalf("%s %s: %v, want one authoritative answer", network, name, resp)
			}
			if rr, ok := resp.Answer[0].(*dns.A); !ok || rr.A.String() != "10.96.0.10" {
				t.Errorf("%s %s: answer %v, want A 10.96.0.10", network, name, resp.Answer[0])
			}
		}
		resp, err := queryFrom(t, a, network, server, "outside.example.com")
		if err != nil {
			t.Fatalf("%s outside.example.com: %v", network, err)
		}
		if len(resp.Answer) != 1 || resp.Authoritative {
			t.Fatalf("%s outside.example.com: %v, want one forwarded answer", network, resp)
		}
		if rr, ok := resp.Answer[0].(*dns.A); !ok || rr.A.String() != "192.0.2.1" {
			t.Errorf("%s outside.example.com: answer %v, want A 192.0.2.1", network, resp.Answer[0])
		}
	}
	var outside int
	for _, q := range resolver.seen() {
		src, name, _ := strings.Cut(q, " ")
		if name == "outside.example.com." {
			outside++
			if src != a.ip {
				t.Errorf("the nameserver got the forwarded query from %s, want pod A's %s", src, a.ip)
			}
		}
	}
	if outside != 2 {
		t.Errorf("the nameserver got %d queries for outside.example.com, want 2 (UDP, TCP): %v", outside, resolver.seen())
	}
}
