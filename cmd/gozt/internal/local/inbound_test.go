//lint:file-ignore SA1019 x/net's http2.Transport is deliberately used as an independent HBONE peer (issue 2), deprecated or not.

package local

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
)

var (
	clientID = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	serverID = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "server"}
)

// clientTLS is an mTLS config with the client workload's certificate that
// expects the server workload's identity.
func (tm *testMesh) clientTLS(t *testing.T) *tls.Config {
	t.Helper()
	cert, err := tm.CA().Issue(context.Background(), clientID)
	if err != nil {
		t.Fatal(err)
	}
	return certs.ClientConfig(cert, []string{serverID.String()})
}

// hboneClient opens our HBONE client connection to the server's 15008.
func (tm *testMesh) hboneClient(t *testing.T) *hbone.ClientConn {
	t.Helper()
	raw, err := net.Dial("tcp", net.JoinHostPort(tm.ips.Server, "15008"))
	if err != nil {
		t.Fatalf("dial 15008: %v", err)
	}
	tc := tls.Client(raw, tm.clientTLS(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestInboundStatusCodes: the checks of SPEC §2.4 answer 400 and 503, and in
// none of those cases is anything dialed.
func TestInboundStatusCodes(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	cc := tm.hboneClient(t)
	for _, tc := range []struct {
		name, authority string
		want            int
	}{
		{"bad authority", "no-port-here", http.StatusBadRequest},
		{"port zero", tm.ips.Server + ":0", http.StatusBadRequest},
		{"ip mismatch", tm.ips.Client + ":8080", http.StatusBadRequest},
		{"refused dial", tm.ips.Server + ":1", http.StatusServiceUnavailable},
		{"self-call outbound port", tm.ips.Server + ":15001", http.StatusServiceUnavailable},
		{"self-call inbound port", tm.ips.Server + ":15008", http.StatusServiceUnavailable},
		{"unknown hostname", "nosuch.demo.svc.cluster.local:80", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := cc.Connect(ctx, tc.authority, nil)
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.want {
				if s != nil {
					s.Close()
				}
				t.Fatalf("CONNECT %s: err = %v, want status %d", tc.authority, err, tc.want)
			}
		})
	}
	if got := b.accepted(); len(got) != 0 {
		t.Errorf("backend was dialed %d times by rejected requests", len(got))
	}

	// A hostname authority (service host and service port) is served.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := cc.Connect(ctx, "echo.demo.svc.cluster.local:80", nil)
	if err != nil {
		t.Fatalf("CONNECT by hostname: %v", err)
	}
	roundTrip(t, s)
	s.Close()
}

// TestInboundNonConnect: an x/net HTTP/2 client sending GET gets 400 and the
// backend is not dialed.
func TestInboundNonConnect(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	tr := &http2.Transport{TLSClientConfig: tm.clientTLS(t)}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := cl.Get("https://" + tm.ips.Server + ":15008/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET through 15008 = %d, want 400", resp.StatusCode)
	}
	if got := b.accepted(); len(got) != 0 {
		t.Errorf("backend dialed for a GET")
	}
}

// TestXNetTransportInterop: x/net's http2.Transport, an HBONE client we did
// not write, CONNECTs through our 15008 and exchanges bytes both ways.
func TestXNetTransportInterop(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	tr := &http2.Transport{TLSClientConfig: tm.clientTLS(t)}
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "https://"+tm.ips.Server+":15008", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = tm.ips.Server + ":8080"
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT status = %d, want 200", resp.StatusCode)
	}
	msg := []byte("hello through x/net")
	go func() {
		pw.Write(msg)
		pw.Close()
	}()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != string(msg) {
		t.Errorf("echo = %q, %v; want %q", got, err, msg)
	}
	if src := b.accepted(); len(src) != 1 {
		t.Errorf("backend accepted %d connections, want 1", len(src))
	}
}

// TestWrongIdentityRejected: a client certificate from another trust domain
// is refused at the handshake (TESTPLAN S9).
func TestWrongIdentityRejected(t *testing.T) {
	tm := startMesh(t)
	other := identity.Identity{TrustDomain: "evil.local", Namespace: "demo", ServiceAccount: "client"}
	cert, err := tm.CA().Issue(context.Background(), other)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", net.JoinHostPort(tm.ips.Server, "15008"))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, certs.ClientConfig(cert, []string{serverID.String()}))
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3: the server's verdict on the client cert arrives with the
		// first read.
		tc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = tc.Read(make([]byte, 1))
	}
	tc.Close()
	if err == nil {
		t.Fatal("handshake with a foreign trust domain succeeded")
	}
}
