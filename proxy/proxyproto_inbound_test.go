package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	proxyproto "github.com/pires/go-proxyproto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// issuedCerts issues every identity from one local CA.
type issuedCerts struct{ ca *localca.CA }

func (c issuedCerts) Get(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	return c.ca.Issue(ctx, id)
}

// The inbound side of a PROXY application tunnel with
// LOCALHOST_APP_TUNNEL=false (AppTunnelToPodIP), on 127.88.250.0/24: a
// client and a server workload, the server's tunnel port behind
// go-proxyproto on the server's own IP.
const (
	ppClientIP = "127.88.250.2"
	ppServerIP = "127.88.250.3"
)

var (
	ppClientID = identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "client"}
	ppServerID = identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "server"}
)

// TestAppTunnelToPodIP: with AppTunnelToPodIP the tunnel is dialed on the
// pod IP from the HBONE peer's IP (the usual source rule, SPEC §2.5), and
// still starts with the PROXY header from the peer to the authority with
// the peer's SPIFFE URI (SPEC §2.7), then the payload both ways.
func TestAppTunnelToPodIP(t *testing.T) {
	ln, err := net.Listen("tcp", ppServerIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	pln := &proxyproto.Listener{Listener: ln, ReadHeaderTimeout: 5 * time.Second}
	defer pln.Close()
	tunnelPort := uint16(ln.Addr().(*net.TCPAddr).Port)

	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	server := nsWorkload("server", ppServerIP)
	server.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: tunnelPort}
	store := storeWith(t, func(b *state.Batch) []error {
		return []error{b.InsertWorkload(nsWorkload("client", ppClientIP)), b.InsertWorkload(server)}
	})
	serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(ppServerIP), InboundOnly: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
		AppTunnelToPodIP: true,
	}, 5*time.Second)

	cert, err := ca.Issue(context.Background(), ppClientID)
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ppClientIP)}}
	raw, err := d.Dial("tcp", net.JoinHostPort(ppServerIP, "15008"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{ppServerID.String()})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, err := cc.Connect(ctx, ppServerIP+":8080", nil)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}

	c, err := pln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := c.(*proxyproto.Conn)
	h := pc.ProxyHeader()
	if h == nil {
		t.Fatal("the tunnel backend read no PROXY header")
	}
	tlvs, _ := h.TLVs()
	got := []any{h.SourceAddr.String(), h.DestinationAddr.String(), tlvs, pc.Raw().RemoteAddr().(*net.TCPAddr).IP.String()}
	want := []any{raw.LocalAddr().String(), ppServerIP + ":8080",
		[]proxyproto.TLV{{Type: proxyTLVPeerIdentity, Value: []byte(ppClientID.String())}}, ppClientIP}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(header source, destination, TLVs, tunnel connection's source) mismatch (-want +got):\n%s", diff)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("after the header = %q, %v; want %q", buf, err, "ping")
	}
	if _, err := c.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("back through the tunnel = %q, %v; want %q", buf, err, "pong")
	}
}

// TestDialLoopback: a localhost application tunnel goes to the loopback
// address of the pod IP's family, from that address (SPEC §2.7).
func TestDialLoopback(t *testing.T) {
	p, err := New(Config{WorkloadUID: "w", Store: state.NewStore(state.Config{}), Certs: issuedCerts{}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	defer p.pool.Close()
	for _, tc := range []struct{ lo, podIP string }{{"127.0.0.1", "10.0.0.3"}, {"::1", "fd00::3"}} {
		t.Run(tc.lo, func(t *testing.T) {
			ln, err := net.Listen("tcp", net.JoinHostPort(tc.lo, "0"))
			if err != nil {
				t.Skipf("no %s: %v", tc.lo, err)
			}
			defer ln.Close()
			port := uint16(ln.Addr().(*net.TCPAddr).Port)
			c, err := p.dialLoopback(netip.AddrPortFrom(netip.MustParseAddr(tc.podIP), port))
			if err != nil {
				t.Fatalf("dialLoopback(%s:%d) = %v", tc.podIP, port, err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			a, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if b, _ := bufio.NewReader(a).ReadByte(); b != 'x' {
				t.Errorf("read %q, want x", b)
			}
			lo := netip.MustParseAddr(tc.lo)
			if src := addrPortOf(a.RemoteAddr()).Addr(); src != lo {
				t.Errorf("dialLoopback(%s:%d) came from %s, want %s", tc.podIP, port, src, lo)
			}
		})
	}
}
