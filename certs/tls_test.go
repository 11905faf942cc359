package certs_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/certstest"
)

type ctxKey struct{}

func TestHandshakeSuccess(t *testing.T) {
	ca := newCA(t)
	srvCert, cliCert := issue(t, ca, idA), issue(t, ca, idB)

	var sawSNI []string
	var sawCtxValue []any
	srv := certs.ServerConfig(func(ctx context.Context) (*certs.Cert, error) {
		sawCtxValue = append(sawCtxValue, ctx.Value(ctxKey{}))
		return srvCert, nil
	})
	inner := srv.GetConfigForClient
	srv.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sawSNI = append(sawSNI, h.ServerName)
		return inner(h)
	}
	cli := certs.ClientConfig(cliCert, []string{"spiffe://cluster.local/ns/x/sa/x", idA.String()})

	ctx := context.WithValue(t.Context(), ctxKey{}, "handshake-ctx")
	r := handshake(t, ctx, srv, cli)
	if r.serverErr != nil || r.clientErr != nil {
		t.Fatalf("handshake: server %v, client %v", r.serverErr, r.clientErr)
	}
	if diff := cmp.Diff([]any{"handshake-ctx"}, sawCtxValue); diff != "" {
		t.Errorf("get called with contexts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{""}, sawSNI); diff != "" {
		t.Errorf("SNI sent (-want +got):\n%s", diff)
	}
	for name, cs := range map[string]tls.ConnectionState{"server": r.serverState, "client": r.clientState} {
		if cs.Version != tls.VersionTLS13 {
			t.Errorf("%s: version %#x, want TLS 1.3", name, cs.Version)
		}
		if cs.NegotiatedProtocol != "h2" {
			t.Errorf("%s: ALPN %q, want h2", name, cs.NegotiatedProtocol)
		}
		if cs.DidResume {
			t.Errorf("%s: resumed session", name)
		}
	}
	if got, err := certs.PeerIdentity(&r.serverState); err != nil || got != idB {
		t.Errorf("server PeerIdentity = %v, %v; want %v", got, err, idB)
	}
	if got, err := certs.PeerIdentity(&r.clientState); err != nil || got != idA {
		t.Errorf("client PeerIdentity = %v, %v; want %v", got, err, idA)
	}
}

func TestConfigSettings(t *testing.T) {
	ca := newCA(t)
	c := issue(t, ca, idA)
	cli := certs.ClientConfig(c, []string{idB.String()})
	if cli.ServerName != "" || cli.ClientSessionCache != nil || cli.MinVersion != tls.VersionTLS13 {
		t.Errorf("ClientConfig: ServerName %q, session cache %v, MinVersion %#x", cli.ServerName, cli.ClientSessionCache, cli.MinVersion)
	}
	srv := certs.ServerConfig(serveCert(c))
	if !srv.SessionTicketsDisabled || srv.MinVersion != tls.VersionTLS13 || srv.ClientAuth != tls.RequireAnyClientCert {
		t.Errorf("ServerConfig: tickets disabled %v, MinVersion %#x, ClientAuth %v", srv.SessionTicketsDisabled, srv.MinVersion, srv.ClientAuth)
	}
}

// TestServerRejects covers TESTPLAN items 28–33 and 35–36 on the inbound side.
func TestServerRejects(t *testing.T) {
	ca, otherCA := newCA(t), newCA(t)
	srvCert := issue(t, ca, idA)
	good := issue(t, ca, idB)

	expired := certstest.LeafTemplate(t, idB.String())
	expired.NotBefore, expired.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	notYet := certstest.LeafTemplate(t, idB.String())
	notYet.NotBefore, notYet.NotAfter = time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
	serverOnly := certstest.LeafTemplate(t, idB.String())
	serverOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	caLeaf := certstest.LeafTemplate(t, idB.String())
	caLeaf.IsCA, caLeaf.KeyUsage = true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature
	crlLeaf := certstest.LeafTemplate(t, idB.String())
	crlLeaf.KeyUsage |= x509.KeyUsageCRLSign
	noURI := certstest.LeafTemplate(t)
	noURI.DNSNames = []string{"b.b.svc.cluster.local"}

	deepChain := rawTLSCert(t, ca, certstest.LeafTemplate(t, idB.String()))
	for range 49 {
		deepChain.Certificate = append(deepChain.Certificate, ca.Roots()[0].Raw)
	}
	withGoodCert := func(mod func(*tls.Config)) *tls.Config {
		cfg := certs.ClientConfig(good, []string{idA.String()})
		mod(cfg)
		return cfg
	}

	tests := []struct {
		name    string
		client  *tls.Config
		wantErr error // nil: any error
	}{
		{"no client cert", rawClientConfig(tls.Certificate{}), nil},
		{"other CA", rawClientConfig(*issue(t, otherCA, idB).TLSCertificate()), certs.ErrUntrusted},
		{"wrong trust domain", rawClientConfig(*issue(t, ca, idOther).TLSCertificate()), certs.ErrTrustDomainMismatch},
		{"expired", rawClientConfig(rawTLSCert(t, ca, expired)), certs.ErrUntrusted},
		{"not yet valid", rawClientConfig(rawTLSCert(t, ca, notYet)), certs.ErrUntrusted},
		{"server-auth only leaf", rawClientConfig(rawTLSCert(t, ca, serverOnly)), certs.ErrUntrusted},
		{"CA leaf", rawClientConfig(rawTLSCert(t, ca, caLeaf)), certs.ErrBadLeaf},
		{"CRL-signing leaf", rawClientConfig(rawTLSCert(t, ca, crlLeaf)), certs.ErrBadLeaf},
		{"no URI SAN", rawClientConfig(rawTLSCert(t, ca, noURI)), certs.ErrNoSPIFFEID},
		{"two URI SANs", rawClientConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, idB.String(), "spiffe://cluster.local/ns/c/sa/c"))), certs.ErrNoSPIFFEID},
		{"non-SPIFFE URI", rawClientConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, "https://cluster.local/ns/b/sa/b"))), certs.ErrNoSPIFFEID},
		{"short SPIFFE ID", rawClientConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, "spiffe://cluster.local/ns/b"))), certs.ErrNoSPIFFEID},
		{"extra segment", rawClientConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, idB.String()+"/x"))), certs.ErrNoSPIFFEID},
		{"percent-encoded", rawClientConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, "spiffe://cluster.local/ns/b/sa/%62"))), certs.ErrNoSPIFFEID},
		{"NUL in URI SAN", rawClientConfig(nulSANCert(t)), nil},
		{"50-deep chain", rawClientConfig(deepChain), certs.ErrChainTooLong},
		{"TLS 1.2 only", withGoodCert(func(c *tls.Config) { c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12 }), nil},
		{"no ALPN", func() *tls.Config {
			c := rawClientConfig(*good.TLSCertificate())
			c.NextProtos = nil
			return c
		}(), certs.ErrALPN},
		{"http/1.1 ALPN", withGoodCert(func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := handshake(t, t.Context(), certs.ServerConfig(serveCert(srvCert)), tt.client)
			if r.serverErr == nil {
				t.Fatalf("server accepted the client")
			}
			if tt.wantErr != nil && !errors.Is(r.serverErr, tt.wantErr) {
				t.Errorf("server error = %v, want %v", r.serverErr, tt.wantErr)
			}
			if r.clientErr == nil {
				t.Errorf("client saw no error")
			}
		})
	}
}

// nulSANCert is a leaf whose only URI SAN is
// "spiffe://cluster.local/ns/b/sa/b\x00.evil", encoded raw so that nothing
// escapes the NUL (TESTPLAN S18). crypto/x509 cannot parse it, so it is
// self-signed: the peer must fail at parsing, before any trust decision.
func nulSANCert(t testing.TB) tls.Certificate {
	t.Helper()
	tmpl := certstest.LeafTemplate(t)
	tmpl.SerialNumber = big.NewInt(1)
	uri := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(idB.String() + "\x00.evil")}
	val, err := asn1.Marshal([]asn1.RawValue{uri})
	if err != nil {
		t.Fatal(err)
	}
	tmpl.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: true, Value: val}}
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x509.ParseCertificate(der); err == nil {
		t.Fatal("crypto/x509 now parses URI SANs with NUL; re-check uriSANs")
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestClientRejects(t *testing.T) {
	ca, otherCA := newCA(t), newCA(t)
	cliCert := issue(t, ca, idB)
	want := []string{idA.String()}

	expired := certstest.LeafTemplate(t, idA.String())
	expired.NotBefore, expired.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	clientOnly := certstest.LeafTemplate(t, idA.String())
	clientOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	dnsMatch := certstest.LeafTemplate(t)
	dnsMatch.DNSNames = []string{idA.String(), "cluster.local"}
	noALPN := rawServerConfig(*issue(t, ca, idA).TLSCertificate())
	noALPN.NextProtos = nil

	tests := []struct {
		name     string
		server   *tls.Config
		expected []string
		wantErr  error // nil: any error
	}{
		{"identity not expected", certs.ServerConfig(serveCert(issue(t, ca, idB))), want, certs.ErrSANMismatch},
		{"empty expected set", certs.ServerConfig(serveCert(issue(t, ca, idA))), nil, certs.ErrSANMismatch},
		{"other CA", rawServerConfig(*issue(t, otherCA, idA).TLSCertificate()), want, certs.ErrUntrusted},
		{"expired", rawServerConfig(rawTLSCert(t, ca, expired)), want, certs.ErrUntrusted},
		{"client-auth only leaf", rawServerConfig(rawTLSCert(t, ca, clientOnly)), want, certs.ErrUntrusted},
		{"DNS SAN ignored", rawServerConfig(rawTLSCert(t, ca, dnsMatch)), want, certs.ErrSANMismatch},
		{"prefix is not a match", rawServerConfig(rawTLSCert(t, ca, certstest.LeafTemplate(t, idA.String()+"x"))), want, certs.ErrSANMismatch},
		{"NUL in URI SAN", rawServerConfig(nulSANCert(t)), []string{idB.String()}, nil},
		{"no ALPN", noALPN, want, certs.ErrALPN},
		{"TLS 1.2 server", func() *tls.Config {
			c := rawServerConfig(*issue(t, ca, idA).TLSCertificate())
			c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			return c
		}(), want, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := handshake(t, t.Context(), tt.server, certs.ClientConfig(cliCert, tt.expected))
			if r.clientErr == nil {
				t.Fatalf("client accepted the server")
			}
			if tt.wantErr != nil && !errors.Is(r.clientErr, tt.wantErr) {
				t.Errorf("client error = %v, want %v", r.clientErr, tt.wantErr)
			}
		})
	}
}

func TestClientAcceptsOneOfTwoSANs(t *testing.T) {
	ca := newCA(t)
	cliCert := issue(t, ca, idB)
	two := rawTLSCert(t, ca, certstest.LeafTemplate(t, "spiffe://cluster.local/ns/x/sa/x", idA.String()))
	r := handshake(t, t.Context(), rawServerConfig(two), certs.ClientConfig(cliCert, []string{idA.String()}))
	if r.clientErr != nil || r.serverErr != nil {
		t.Fatalf("handshake: client %v, server %v", r.clientErr, r.serverErr)
	}
	// PeerIdentity is the first parseable SPIFFE SAN.
	if got, err := certs.PeerIdentity(&r.clientState); err != nil || got.Namespace != "x" {
		t.Errorf("PeerIdentity = %v, %v; want ns x", got, err)
	}
}

func TestServerGetError(t *testing.T) {
	ca := newCA(t)
	errNoCert := errors.New("no cert for you")
	srv := certs.ServerConfig(func(context.Context) (*certs.Cert, error) { return nil, errNoCert })
	r := handshake(t, t.Context(), srv, certs.ClientConfig(issue(t, ca, idB), []string{idA.String()}))
	if !errors.Is(r.serverErr, errNoCert) {
		t.Errorf("server error = %v, want %v", r.serverErr, errNoCert)
	}
	if r.clientErr == nil {
		t.Errorf("client saw no error")
	}
}

func TestServerRequiresAESGCM(t *testing.T) {
	ca := newCA(t)
	called := false
	srv := certs.ServerConfig(func(context.Context) (*certs.Cert, error) {
		called = true
		return issue(t, ca, idA), nil
	})
	tests := []struct {
		suites []uint16
		ok     bool
	}{
		{[]uint16{tls.TLS_CHACHA20_POLY1305_SHA256}, false},
		{nil, false},
		{[]uint16{tls.TLS_CHACHA20_POLY1305_SHA256, tls.TLS_AES_256_GCM_SHA384}, true},
		{[]uint16{tls.TLS_AES_128_GCM_SHA256}, true},
	}
	for _, tt := range tests {
		called = false
		hello := &tls.ClientHelloInfo{CipherSuites: tt.suites}
		cfg, err := srv.GetConfigForClient(hello)
		if tt.ok != (err == nil) || tt.ok != called {
			t.Errorf("GetConfigForClient(suites %x) = %v, %v (get called %v), want ok %v", tt.suites, cfg != nil, err, called, tt.ok)
		}
		if !tt.ok && !errors.Is(err, certs.ErrCipherSuite) {
			t.Errorf("GetConfigForClient(suites %x) error = %v, want ErrCipherSuite", tt.suites, err)
		}
	}
}

func TestPeerIdentityErrors(t *testing.T) {
	ca := newCA(t)
	if _, err := certs.PeerIdentity(&tls.ConnectionState{}); !errors.Is(err, certs.ErrNoPeerCertificate) {
		t.Errorf("PeerIdentity(no certs) = %v, want ErrNoPeerCertificate", err)
	}
	if _, err := certs.PeerIdentity(nil); !errors.Is(err, certs.ErrNoPeerCertificate) {
		t.Errorf("PeerIdentity(nil) = %v, want ErrNoPeerCertificate", err)
	}
	bad := rawTLSCert(t, ca, certstest.LeafTemplate(t, "https://example.com", "spiffe://td/ns/a"))
	cs := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{bad.Leaf}}
	if _, err := certs.PeerIdentity(cs); !errors.Is(err, certs.ErrNoSPIFFEID) {
		t.Errorf("PeerIdentity(no SPIFFE SAN) = %v, want ErrNoSPIFFEID", err)
	}
	mixed := rawTLSCert(t, ca, certstest.LeafTemplate(t, "https://example.com", idB.String()))
	cs = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{mixed.Leaf}}
	if got, err := certs.PeerIdentity(cs); err != nil || got != idB {
		t.Errorf("PeerIdentity(mixed) = %v, %v; want %v", got, err, idB)
	}
}

// BenchmarkVerifyPeer measures the per-handshake peer checks alone, without
// the TLS handshake around them.
func BenchmarkVerifyPeer(b *testing.B) {
	ca := newCA(b)
	srv, cli := issue(b, ca, idA), issue(b, ca, idB)
	now := time.Now()
	state := func(peer *certs.Cert) *tls.ConnectionState {
		return &tls.ConnectionState{Version: tls.VersionTLS13, NegotiatedProtocol: "h2", PeerCertificates: peer.Chain()}
	}
	b.Run("inbound", func(b *testing.B) {
		cs := state(cli)
		b.ReportAllocs()
		for b.Loop() {
			if err := certs.VerifyClientForTest(srv, cs, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("outbound", func(b *testing.B) {
		cs, want := state(srv), []string{idB.String(), idA.String()}
		b.ReportAllocs()
		for b.Loop() {
			if err := certs.VerifyServerForTest(cli, want, cs, now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
