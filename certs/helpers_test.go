package certs_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	idA     = identity.MustParse("spiffe://cluster.local/ns/a/sa/a")
	idB     = identity.MustParse("spiffe://cluster.local/ns/b/sa/b")
	idOther = identity.MustParse("spiffe://clusterset.local/ns/b/sa/b")
)

func newCA(t testing.TB) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{TTL: time.Hour})
	if err != nil {
		t.Fatalf("localca.New: %v", err)
	}
	return ca
}

func issue(t testing.TB, ca *localca.CA, id identity.Identity) *certs.Cert {
	t.Helper()
	c, err := ca.Issue(context.Background(), id)
	if err != nil {
		t.Fatalf("Issue(%v): %v", id, err)
	}
	return c
}

func newKey(t testing.TB) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// rawTLSCert signs tmpl with ca and returns it as a tls.Certificate,
// bypassing NewCert's checks (for hostile peers).
func rawTLSCert(t testing.TB, ca *localca.CA, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key := newKey(t)
	leaf, err := ca.IssueWithTemplate(context.Background(), key, tmpl)
	if err != nil {
		t.Fatalf("IssueWithTemplate: %v", err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// rawClientConfig is a client that presents cert and checks nothing: a
// possibly hostile peer for ServerConfig.
func rawClientConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{"h2"},
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true,
	}
}

// rawServerConfig is a server that presents cert and checks nothing: a
// possibly hostile peer for ClientConfig.
func rawServerConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{"h2"},
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
	}
}

func serveCert(c *certs.Cert) func(context.Context) (*certs.Cert, error) {
	return func(context.Context) (*certs.Cert, error) { return c, nil }
}

type result struct {
	serverErr, clientErr     error
	serverState, clientState tls.ConnectionState
}

// handshake runs a TLS handshake between srv and cli over loopback TCP
// (net.Pipe has no buffering, so a peer that aborts mid-flight and a peer
// still writing its flight would block each other). After a successful
// handshake the server writes "ok" and the client reads it, so a client
// certificate rejected by a TLS 1.3 server (which the client only learns
// after its own handshake finished) shows up as clientErr too.
func handshake(t testing.TB, ctx context.Context, srv, cli *tls.Config) result {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	deadline := time.Now().Add(10 * time.Second)
	var r result
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc, err := ln.Accept()
		if err != nil {
			r.serverErr = err
			return
		}
		defer sc.Close()
		sc.SetDeadline(deadline)
		s := tls.Server(sc, srv)
		r.serverErr = s.HandshakeContext(ctx)
		r.serverState = s.ConnectionState()
		if r.serverErr == nil {
			_, r.serverErr = s.Write([]byte("ok"))
		}
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cc.SetDeadline(deadline)
	c := tls.Client(cc, cli)
	r.clientErr = c.HandshakeContext(ctx)
	r.clientState = c.ConnectionState()
	if r.clientErr == nil {
		buf := make([]byte, 2)
		_, r.clientErr = io.ReadFull(c, buf)
	}
	cc.Close()
	<-done
	return r
}
