package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	xproxy "golang.org/x/net/proxy"
	"google.golang.org/grpc/codes"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/internal/tcptest"
)

// TestResponseFlags: each outbound failure is recorded with the
// response_flags value ztunnel gives it (SPEC §7.1): TLS_FAILURE when the
// HBONE peer does not speak TLS, H2_HANDSHAKE_FAILURE when it completes TLS
// but not HTTP/2, IDENTITY_ERROR when the source's own certificate cannot be
// had, CONNECT when nothing listens.
func TestResponseFlags(t *testing.T) {
	nextNet++
	ip := func(host int) string { return fmt.Sprintf("127.88.%d.%d", nextNet, host) }
	clientIP, lonelyIP, tlsIP, h2IP, closedIP := ip(2), ip(3), ip(4), ip(5), ip(6)
	cp := newControlPlane(t)
	client := cp.startNode(t, "client", clientIP)
	cp.cas.SetModeFor(identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "lonely"},
		istiocatest.Error(codes.PermissionDenied))
	lonely := cp.startNode(t, "lonely", lonelyIP)
	cp.xds.PushWorkload(workload("client", clientIP), workload("lonely", lonelyIP),
		workload("tls", tlsIP), workload("h2", h2IP), workload("closed", closedIP))

	// tlsIP:15008 answers with bytes that are not TLS.
	garbage, err := net.Listen("tcp", tlsIP+":15008")
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	serveEach(t, garbage, func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) })

	// h2IP:15008 completes TLS with h2's certificate, then says nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h2Cert, err := cp.ca.Issue(ctx, identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "h2"})
	if err != nil {
		t.Fatal(err)
	}
	tlsOnly, err := tls.Listen("tcp", h2IP+":15008", &tls.Config{
		Certificates: []tls.Certificate{*h2Cert.TLSCertificate()}, NextProtos: []string{"h2"},
		ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tlsOnly.Close()
	serveEach(t, tlsOnly, func(c net.Conn) { c.(*tls.Conn).Handshake() })

	for _, tc := range []struct {
		node   *Node
		from   string
		target string
		flag   string
	}{
		{client, clientIP, tlsIP + ":8080", "TLS_FAILURE"},
		{client, clientIP, h2IP + ":8080", "H2_HANDSHAKE_FAILURE"},
		{client, clientIP, closedIP + ":8080", "CONNECT"},
		{lonely, lonelyIP, tlsIP + ":8080", "IDENTITY_ERROR"},
	} {
		if err := socksPing(tc.from, tc.target); err == nil {
			t.Errorf("%s → %s succeeded", tc.from, tc.target)
		}
		want := `response_flags="` + tc.flag + `"`
		deadline := time.Now().Add(5 * time.Second)
		for {
			m := get(t, "http://"+tc.node.MetricsAddr().String()+"/metrics")
			if hasSeries(m, "istio_tcp_connections_failed_total", `reporter="source"`, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s → %s: no failed connection with %s:\n%s", tc.from, tc.target, want, grepLines(m, "istio_tcp_connections_failed_total"))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// serveEach runs handle, with a 5s deadline, on every connection ln
// accepts until the test ends, then closes it.
func serveEach(t *testing.T, ln net.Listener, handle func(net.Conn)) {
	tcptest.Serve(t, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		handle(c)
	})
}

// hasSeries reports whether the exposition text has a sample of name whose
// labels include every one given.
func hasSeries(text, name string, labels ...string) bool {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func grepLines(text, substr string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestPoolStreamCap: with POOL_MAX_STREAMS_PER_CONNECTION=150, 140
// concurrent connections to one peer share one HBONE connection: the cap is
// min(the setting, the peer's 200), not a fixed 100 (SPEC §2.2; issue 12,
// defect 1, where they took 2 connections).
func TestPoolStreamCap(t *testing.T) {
	nextNet++
	clientIP, serverIP := fmt.Sprintf("127.88.%d.2", nextNet), fmt.Sprintf("127.88.%d.3", nextNet)
	cp := newControlPlane(t)
	cp.startNodeEnv(t, "client", clientIP, "POOL_MAX_STREAMS_PER_CONNECTION=150")
	server := cp.startNode(t, "server", serverIP)
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	echo(t, serverIP+":8080")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 140 {
		d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
		c, err := d.Dial("tcp", serverIP+":8080")
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if err := ping(c); err != nil {
			t.Fatal(err)
		}
	}
	m := get(t, "http://"+server.MetricsAddr().String()+"/metrics")
	if !strings.Contains(m, `istio_tcp_sockets_open{reporter="destination"} 1`) {
		t.Errorf("140 streams used more than one HBONE connection:\n%s", grepLines(m, "istio_tcp_sockets_open"))
	}
}
