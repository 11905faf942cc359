package local

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	proxyproto "github.com/pires/go-proxyproto"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
)

// Application tunnels through a local mesh (SPEC §2.7): a client, a
// waypoint-like workload whose tunnel speaks PROXY, and a workload whose
// tunnel speaks NONE, on loopback addresses of their own /24 in
// 127.88.0.0/16. The PROXY tunnel's server listens on 127.0.0.1 (local mode
// keeps ztunnel's default LOCALHOST_APP_TUNNEL=true) behind go-proxyproto,
// a PROXY v2 parser we did not write.
type tunIPs struct {
	Client, Proxy, None string
	VIP, VIP6           string
	ProxyPort, NonePort int
}

var nextTunNet atomic.Int32

const tunConfig = `
workloads:` + clientWorkload + `- uid: Kubernetes//Pod/demo/waypoint
  name: waypoint
  namespace: demo
  serviceAccount: waypoint
  workloadIps: [{{.Proxy}}]
  protocol: HBONE
  applicationTunnel: {protocol: PROXY, port: {{.ProxyPort}}}
  services:
    demo/tun.demo.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/demo/plain
  name: plain
  namespace: demo
  serviceAccount: plain
  workloadIps: [{{.None}}]
  protocol: HBONE
  applicationTunnel: {protocol: NONE, port: {{.NonePort}}}
services:
- name: tun
  namespace: demo
  hostname: tun.demo.svc.cluster.local
  vips: [/{{.VIP6}}, /{{.VIP}}]
  ports:
    80: 8080
`

var tunWaypointID = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "waypoint"}

// tunnelBackend accepts connections and hands each, with what arrived,
// to the test.
type tunnelBackend struct {
	conns chan net.Conn
	wg    sync.WaitGroup
}

func serveTunnelBackend(t *testing.T, ln net.Listener) *tunnelBackend {
	t.Helper()
	b := &tunnelBackend{conns: make(chan net.Conn, 4)}
	b.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.conns <- c
		}
	})
	t.Cleanup(func() {
		ln.Close()
		b.wg.Wait()
		close(b.conns)
		for c := range b.conns {
			c.Close()
		}
	})
	return b
}

// next returns the next accepted connection, failing after 5s.
func (b *tunnelBackend) next(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-b.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("the tunnel backend accepted no connection")
		return nil
	}
}

// startTunnelMesh listens for both tunnels' backends (the PROXY one on
// 127.0.0.1 behind go-proxyproto, the NONE one on its workload's IP) and
// starts the mesh above with their ports.
func startTunnelMesh(t *testing.T) (*testMesh, tunIPs, *tunnelBackend, *tunnelBackend) {
	t.Helper()
	n := 200 + nextTunNet.Add(1) // node tests take 127.88.11 and up
	ips := tunIPs{
		Client: fmt.Sprintf("127.88.%d.2", n),
		Proxy:  fmt.Sprintf("127.88.%d.3", n),
		None:   fmt.Sprintf("127.88.%d.4", n),
		VIP:    fmt.Sprintf("127.88.%d.100", n),
		VIP6:   fmt.Sprintf("fd00:88::%d", n),
	}
	lnProxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lnNone, err := net.Listen("tcp", ips.None+":0")
	if err != nil {
		lnProxy.Close()
		t.Fatal(err)
	}
	ips.ProxyPort, ips.NonePort = lnProxy.Addr().(*net.TCPAddr).Port, lnNone.Addr().(*net.TCPAddr).Port
	proxied := serveTunnelBackend(t, &proxyproto.Listener{Listener: lnProxy, ReadHeaderTimeout: 5 * time.Second})
	plain := serveTunnelBackend(t, lnNone)

	m, logs := startConfig(t, tunConfig, ips, Options{})
	return &testMesh{Mesh: m, ips: meshIPs{Client: ips.Client, Server: ips.Proxy}, logs: logs}, ips, proxied, plain
}

// proxyHeaderOf is what the backend's go-proxyproto read from c's header.
type proxyHeaderOf struct {
	Command  proxyproto.ProtocolVersionAndCommand
	Src, Dst string
	TLVs     []proxyproto.TLV
}

func readProxyHeader(t *testing.T, c net.Conn) (proxyHeaderOf, *net.TCPConn) {
	t.Helper()
	pc := c.(*proxyproto.Conn)
	h := pc.ProxyHeader()
	if h == nil {
		t.Fatalf("the PROXY tunnel backend read no PROXY header from %s", pc.Raw().RemoteAddr())
	}
	tlvs, err := h.TLVs()
	if err != nil {
		t.Fatalf("TLVs: %v", err)
	}
	tc, _ := pc.TCPConn()
	return proxyHeaderOf{Command: h.Command, Src: h.SourceAddr.String(), Dst: h.DestinationAddr.String(), TLVs: tlvs}, tc
}

// exchange streams n seeded bytes each way between client and backend at
// once, each side half-closing after its own, and checks both arrive
// byte for byte. backendCW half-closes the backend's side.
func exchange(t *testing.T, client, backend net.Conn, backendCW func() error, n int64) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(backend, prng(12, n))
		backendCW()
	})
	wg.Go(func() {
		io.Copy(client, prng(11, n))
		client.(interface{ CloseWrite() error }).CloseWrite()
	})
	backendErr := make(chan error, 1)
	go func() { backendErr <- verifyStream(backend, 11, n) }()
	if err := verifyStream(client, 12, n); err != nil {
		t.Errorf("client received: %v", err)
	}
	if err := <-backendErr; err != nil {
		t.Errorf("tunnel backend received: %v", err)
	}
	wg.Wait()
}

// TestAppTunnelProxy: a connection to a workload whose application tunnel
// speaks PROXY reaches the tunnel port on 127.0.0.1 from a 127.0.0.1
// source, starting with a PROXY v2 header that names the client workload
// as source, the address it asked for as destination, and the client's
// SPIFFE URI in TLV 0xD0; the client's bytes, sent at once, come after
// the header, and the payload is intact both ways.
func TestAppTunnelProxy(t *testing.T) {
	tm, ips, proxied, _ := startTunnelMesh(t)
	c := tm.socksDial(t, ips.Proxy+":8080")
	defer c.Close()
	if _, err := c.Write([]byte("early")); err != nil { // before the backend reads anything
		t.Fatal(err)
	}
	b := proxied.next(t)
	got, raw := readProxyHeader(t, b)
	host, port, _ := net.SplitHostPort(got.Src)
	if host != ips.Client || port == "0" {
		t.Errorf("PROXY header source %s, want the client workload %s with its port", got.Src, ips.Client)
	}
	want := proxyHeaderOf{Command: proxyproto.PROXY, Src: got.Src, Dst: ips.Proxy + ":8080",
		TLVs: []proxyproto.TLV{{Type: 0xD0, Value: []byte(clientID.String())}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PROXY header (-want +got):\n%s", diff)
	}
	if src, dst := raw.RemoteAddr().(*net.TCPAddr), raw.LocalAddr().String(); !src.IP.Equal(net.IPv4(127, 0, 0, 1)) || dst != fmt.Sprintf("127.0.0.1:%d", ips.ProxyPort) {
		t.Errorf("tunnel connection %s → %s, want 127.0.0.1 → 127.0.0.1:%d", src, dst, ips.ProxyPort)
	}
	early := make([]byte, 5)
	if _, err := io.ReadFull(b, early); err != nil || string(early) != "early" {
		t.Fatalf("first bytes after the header = %q, %v; want %q", early, err, "early")
	}
	exchange(t, c, b, raw.CloseWrite, 1<<20)
}

// TestAppTunnelProxyHostname: a CONNECT to a service hostname (as an
// east-west gateway forwards one) names the service's IPv4 VIP with the
// authority's port in the header (SPEC §2.7), and the source is exactly
// the HBONE peer's address.
func TestAppTunnelProxyHostname(t *testing.T) {
	tm, ips, proxied, _ := startTunnelMesh(t)
	cert, err := tm.CA().Issue(context.Background(), clientID)
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ips.Client)}}
	raw, err := d.Dial("tcp", net.JoinHostPort(ips.Proxy, "15008"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{tunWaypointID.String()})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, err := cc.Connect(ctx, "tun.demo.svc.cluster.local:80", nil)
	if err != nil {
		t.Fatalf("CONNECT tun.demo.svc.cluster.local:80: %v", err)
	}
	defer s.Close()
	b := proxied.next(t)
	got, rawUp := readProxyHeader(t, b)
	want := proxyHeaderOf{Command: proxyproto.PROXY, Src: raw.LocalAddr().String(), Dst: ips.VIP + ":80",
		TLVs: []proxyproto.TLV{{Type: 0xD0, Value: []byte(clientID.String())}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PROXY header (-want +got):\n%s", diff)
	}
	exchange(t, s, b, rawUp.CloseWrite, 256<<10)
}

// TestAppTunnelNone: protocol NONE only moves the connection to the tunnel
// port: the backend there gets the client's bytes unmodified, no header,
// from the client workload's IP.
func TestAppTunnelNone(t *testing.T) {
	tm, ips, _, plain := startTunnelMesh(t)
	c := tm.socksDial(t, ips.None+":8080")
	defer c.Close()
	if _, err := c.Write([]byte("raw bytes")); err != nil {
		t.Fatal(err)
	}
	b := plain.next(t)
	first := make([]byte, 9)
	if _, err := io.ReadFull(b, first); err != nil || string(first) != "raw bytes" {
		t.Fatalf("first bytes at the NONE tunnel port = %q, %v; want %q", first, err, "raw bytes")
	}
	if host, _, _ := net.SplitHostPort(b.RemoteAddr().String()); host != ips.Client {
		t.Errorf("NONE tunnel backend saw source %s, want %s", b.RemoteAddr(), ips.Client)
	}
	exchange(t, c, b, b.(*net.TCPConn).CloseWrite, 1<<20)
}
