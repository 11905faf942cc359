package istioca_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/istioca"
	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	idA = identity.MustParse("spiffe://cluster.local/ns/a/sa/a")
	idB = identity.MustParse("spiffe://cluster.local/ns/b/sa/b")
)

func newCA(t testing.TB) *localca.CA {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatalf("localca.New: %v", err)
	}
	return ca
}

// newClient returns a Client for cfg, closed at the end of the test.
func newClient(t testing.TB, cfg istioca.Config) *istioca.Client {
	t.Helper()
	c, err := istioca.New(cfg)
	if err != nil {
		t.Fatalf("istioca.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func writeToken(t *testing.T, path, tok string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestIssueRequest checks, over real gRPC and TLS on loopback, what one
// request carries (SPEC §6.2) and what Issue returns.
func TestIssueRequest(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	tokFile := filepath.Join(t.TempDir(), "istio-token")
	writeToken(t, tokFile, "token-1")
	c := newClient(t, istioca.Config{
		Address:   srv.URL(),
		TLS:       istiocatest.ClientTLS(ca),
		Token:     istioca.TokenFile(tokFile),
		ClusterID: "Kubernetes",
		Headers:   map[string]string{"X-Extra": "v1"},
		TTL:       2 * time.Hour,
	})

	cA, err := c.Issue(context.Background(), idA)
	if err != nil {
		t.Fatalf("Issue(%v): %v", idA, err)
	}
	writeToken(t, tokFile, "token-2") // a rotated token is read afresh
	cB, err := c.Issue(context.Background(), idB)
	if err != nil {
		t.Fatalf("Issue(%v): %v", idB, err)
	}

	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("server got %d requests, want 2", len(reqs))
	}
	type meta struct {
		ID, Authorization, ClusterID, Extra string
		HasImpersonated                     bool
		TTL                                 time.Duration
	}
	var got []meta
	for _, r := range reqs {
		got = append(got, meta{r.Identity.String(), r.Authorization, r.ClusterID,
			strings.Join(r.Header.Get("x-extra"), ","), r.HasImpersonated, r.TTL})
	}
	want := []meta{
		{idA.String(), "Bearer token-1", "Kubernetes", "v1", false, 2 * time.Hour},
		{idB.String(), "Bearer token-2", "Kubernetes", "v1", false, 2 * time.Hour},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request metadata (-want +got):\n%s", diff)
	}
	for i, r := range reqs {
		checkCSR(t, r.CSR, []identity.Identity{idA, idB}[i])
	}
	if reqs[0].CSR.PublicKey.(*ecdsa.PublicKey).Equal(reqs[1].CSR.PublicKey) {
		t.Errorf("two requests used the same key")
	}
	for i, cert := range []*certs.Cert{cA, cB} {
		if !cert.Chain()[0].PublicKey.(*ecdsa.PublicKey).Equal(reqs[i].CSR.PublicKey) {
			t.Errorf("cert %d is not for the key of its CSR", i)
		}
		if d := cert.NotAfter().Sub(cert.NotBefore()); d != 2*time.Hour {
			t.Errorf("cert %d validity = %v, want the requested 2h", i, d)
		}
		if len(cert.Roots) != 1 || !cert.Roots[0].Equal(ca.Roots()[0]) {
			t.Errorf("cert %d roots = %v, want the CA root", i, cert.Roots)
		}
	}
	// The root is parsed once for both (caCache), not held twice.
	if len(cA.Roots) == 1 && len(cB.Roots) == 1 && cA.Roots[0] != cB.Roots[0] {
		t.Errorf("the two certificates hold two parsed copies of the same root; want one shared")
	}
}

// checkCSR checks a CSR has an empty subject, a P-256 key, a SHA-256
// ECDSA signature and exactly one extension, a critical SAN holding only
// the URI id.
func checkCSR(t *testing.T, csr *x509.CertificateRequest, id identity.Identity) {
	t.Helper()
	if csr == nil {
		t.Fatal("CSR did not parse or verify")
	}
	if !bytes.Equal(csr.RawSubject, []byte{0x30, 0x00}) {
		t.Errorf("CSR subject = %q, want empty", csr.Subject)
	}
	if k, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CSR key = %T, want ECDSA P-256", csr.PublicKey)
	}
	if csr.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Errorf("CSR signature = %v, want ECDSA-SHA256", csr.SignatureAlgorithm)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() ||
		len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) != 0 {
		t.Errorf("CSR SANs = %v %v %v %v, want only URI %v", csr.URIs, csr.DNSNames, csr.IPAddresses, csr.EmailAddresses, id)
	}
	if len(csr.Extensions) != 1 || !csr.Extensions[0].Id.Equal(asn1.ObjectIdentifier{2, 5, 29, 17}) || !csr.Extensions[0].Critical {
		t.Errorf("CSR extensions = %+v, want one critical subjectAltName", csr.Extensions)
	}
}

func TestIssueImpersonateAndDefaults(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	plain := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca)})
	imp := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca), Impersonate: true})
	if _, err := plain.Issue(context.Background(), idA); err != nil {
		t.Fatalf("Issue: %v", err)
	}
	if _, err := imp.Issue(context.Background(), idB); err != nil {
		t.Fatalf("Issue impersonating: %v", err)
	}
	r := srv.Requests()
	type meta struct {
		Authorization, ClusterID, Impersonated string
		HasImpersonated                        bool
		TTL                                    time.Duration
	}
	var got []meta
	for _, r := range r {
		got = append(got, meta{r.Authorization, r.ClusterID, r.Impersonated, r.HasImpersonated, r.TTL})
	}
	want := []meta{
		{"", "", "", false, 24 * time.Hour},
		{"", "", idB.String(), true, 24 * time.Hour},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests without token or cluster id, then impersonating (-want +got):\n%s", diff)
	}
	if _, ok := r[0].Header["authorization"]; ok {
		t.Errorf("authorization header sent without a Token")
	}
}

func TestIssueTokenError(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	missing := filepath.Join(t.TempDir(), "none")
	empty := filepath.Join(t.TempDir(), "empty")
	writeToken(t, empty, "  ")
	for name, tok := range map[string]func() (string, error){
		"missing file": istioca.TokenFile(missing),
		"empty file":   istioca.TokenFile(empty),
		"newline":      func() (string, error) { return "a\nb", nil },
	} {
		c := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca), Token: tok})
		if _, err := c.Issue(context.Background(), idA); err == nil || !strings.HasPrefix(err.Error(), "istioca: ") {
			t.Errorf("%s: Issue = %v, want an istioca error", name, err)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d requests sent without a valid token, want 0", n)
	}
}

// TestIssueRejects: every malformed answer is refused with a classifiable
// error (TESTPLAN bad inputs 48–50).
func TestIssueRejects(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	c := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca)})
	tests := []struct {
		mode istiocatest.Mode
		want error
	}{
		{istiocatest.WrongIdentity, certs.ErrIdentityMismatch},
		{istiocatest.EmptyChain, certs.ErrEmptyChain},
		{istiocatest.LeafOnly, certs.ErrNoRoots},
		{istiocatest.Expired, certs.ErrExpired},
		{istiocatest.NotYetValid, certs.ErrUntrusted},
		{istiocatest.WrongKey, certs.ErrKeyMismatch},
		{istiocatest.Untrusted, certs.ErrUntrusted},
		{istiocatest.Garbage, istioca.ErrBadResponse},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			srv.SetMode(tt.mode)
			got, err := c.Issue(context.Background(), idA)
			if !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "istioca: ") {
				t.Errorf("Issue = %v, %v; want istioca: …%v", got, err, tt.want)
			}
		})
	}
	srv.SetMode(istiocatest.Error(codes.PermissionDenied))
	if _, err := c.Issue(context.Background(), idA); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Issue with CA error = %v, want code PermissionDenied", err)
	}
	srv.SetMode(istiocatest.OK)
	if _, err := c.Issue(context.Background(), idA); err != nil {
		t.Errorf("Issue after the CA recovered: %v", err)
	}
}

// TestCAServerVerified: a CA server whose certificate has the wrong name or
// comes from an untrusted CA is refused before any request (TESTPLAN S10);
// ALT_CA_HOSTNAME adds one accepted name.
func TestCAServerVerified(t *testing.T) {
	ca := newCA(t)
	roots := func() (*x509.CertPool, error) { return istioca.RootPool(ca.RootPEM()) }
	cases := []struct {
		name       string
		serverCA   *localca.CA
		serverName string
		alt        string
		wantErr    string
	}{
		{"right name", ca, istiocatest.ServerName, "", ""},
		{"wrong name", ca, "evil.example", "", "valid for evil.example"},
		{"wrong name, other alt", ca, "evil.example", "other.example", "valid for evil.example"},
		{"alt name", ca, "istiod-alt.example", "istiod-alt.example", ""},
		{"untrusted CA", newCA(t), istiocatest.ServerName, "", "unknown authority"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			srv := istiocatest.NewServer(t, ca, istiocatest.ServerTLS(t, tt.serverCA, tt.serverName))
			c := newClient(t, istioca.Config{
				Address: srv.URL(),
				TLS:     istioca.TLSConfig(roots, istiocatest.ServerName, tt.alt),
				Timeout: 5 * time.Second,
			})
			_, err := c.Issue(context.Background(), idA)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Issue: %v", err)
				}
				return
			}
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Issue = %v, want Unavailable …%s", err, tt.wantErr)
			}
			if n := len(srv.Requests()); n != 0 {
				t.Errorf("server got %d requests through a refused TLS handshake", n)
			}
		})
	}
	// The roots are read for every handshake; failing to read them fails it.
	srv0 := istiocatest.NewServer(t, ca, nil)
	noRoots := func() (*x509.CertPool, error) { return nil, errors.New("root-cert.pem unreadable") }
	c0 := newClient(t, istioca.Config{Address: srv0.URL(), TLS: istioca.TLSConfig(noRoots, istiocatest.ServerName, ""), Timeout: 5 * time.Second})
	if _, err := c0.Issue(context.Background(), idA); !strings.Contains(errString(err), "root-cert.pem unreadable") {
		t.Errorf("Issue with unreadable roots = %v", err)
	}
	// The stock crypto/tls path (RootCAs + ServerName) refuses too.
	srv := istiocatest.NewServer(t, ca, istiocatest.ServerTLS(t, ca, "evil.example"))
	c := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca), Timeout: 5 * time.Second})
	if _, err := c.Issue(context.Background(), idA); err == nil {
		t.Errorf("Issue to a CA server named evil.example succeeded")
	}
}

// TestNewAddressForms: the CA takes the address forms xds takes (package
// istiod): with or without https://, and a missing port meaning 443.
func TestNewAddressForms(t *testing.T) {
	good := istiocatest.ClientTLS(newCA(t))
	for _, addr := range []string{"https://istiod", "istiod:15012", "istiod.istio-system.svc:15012"} {
		c, err := istioca.New(istioca.Config{Address: addr, TLS: good})
		if err != nil {
			t.Errorf("New(%q): %v", addr, err)
			continue
		}
		c.Close()
	}
}

func TestNewRejects(t *testing.T) {
	ca := newCA(t)
	good := istiocatest.ClientTLS(ca)
	insecure := &tls.Config{InsecureSkipVerify: true}
	const addr = "https://istiod.istio-system.svc:15012"
	tests := []struct {
		name string
		cfg  istioca.Config
	}{
		{"empty address", istioca.Config{TLS: good}},
		{"plaintext", istioca.Config{Address: "http://istiod:15012", TLS: good}},
		{"query", istioca.Config{Address: "https://istiod:15012?x=1", TLS: good}},
		{"no host", istioca.Config{Address: "https://:15012", TLS: good}},
		{"path", istioca.Config{Address: "https://istiod:15012/x", TLS: good}},
		{"nil TLS", istioca.Config{Address: addr}},
		{"insecure TLS", istioca.Config{Address: addr, TLS: insecure}},
		{"sub-second TTL", istioca.Config{Address: addr, TLS: good, TTL: 500 * time.Millisecond}},
		{"negative TTL", istioca.Config{Address: addr, TLS: good, TTL: -time.Hour}},
		{"reserved header", istioca.Config{Address: addr, TLS: good, Headers: map[string]string{"Authorization": "x"}}},
		{"grpc header", istioca.Config{Address: addr, TLS: good, Headers: map[string]string{"grpc-timeout": "1S"}}},
		{"bad header name", istioca.Config{Address: addr, TLS: good, Headers: map[string]string{"a b": "x"}}},
		{"bad header value", istioca.Config{Address: addr, TLS: good, Headers: map[string]string{"x": "a\r\nb"}}},
		{"binary header", istioca.Config{Address: addr, TLS: good, Headers: map[string]string{"x-bin": "x"}}},
		{"bad cluster id", istioca.Config{Address: addr, TLS: good, ClusterID: "a\nb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := istioca.New(tt.cfg)
			if err == nil {
				c.Close()
				t.Fatalf("New(%+v) succeeded", tt.cfg)
			}
			if !strings.HasPrefix(err.Error(), "istioca: ") {
				t.Errorf("New error %q lacks the istioca: prefix", err)
			}
		})
	}
	for _, a := range []string{addr, "istiod.istio-system.svc:15012", "https://[::1]:15012", "https://10.0.0.1:15012/"} {
		c, err := istioca.New(istioca.Config{Address: a, TLS: good, Headers: map[string]string{"X-Ok": "v"}})
		if err != nil {
			t.Errorf("New(Address %q): %v", a, err)
			continue
		}
		c.Close()
	}
}

func TestClosed(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	c, err := istioca.New(istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Issue(context.Background(), idA); err == nil {
		t.Errorf("Issue after Close succeeded")
	}
}

// TestIssueAfterChannelReplaced: a CA that is down fails Issue with
// Unavailable and the connection's error even when a concurrent Issue
// replaced the failed channel after this one took it (the call is sent
// again on the new channel), not with Canceled from the closed one.
func TestIssueAfterChannelReplaced(t *testing.T) {
	ca := newCA(t)
	srv := istiocatest.NewServer(t, ca, nil)
	srv.SetDown(true)
	c := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca)})
	istioca.ReplaceChannelOnce(t)
	_, err := c.Issue(context.Background(), idA)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "connection error") {
		t.Errorf("Issue error = %v, want Unavailable with the connection error", err)
	}
}
