package istiocatest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"google.golang.org/grpc/codes"
)

// Mode is how the server answers a request. The zero Mode is OK.
type Mode struct {
	kind  kind
	code  codes.Code
	delay time.Duration
}

type kind int

const (
	kindOK kind = iota
	kindError
	kindWrongIdentity
	kindEmptyChain
	kindLeafOnly
	kindExpired
	kindNotYetValid
	kindWrongKey
	kindUntrusted
	kindGarbage
)

var kindNames = map[kind]string{
	kindOK: "OK", kindError: "Error", kindWrongIdentity: "WrongIdentity", kindEmptyChain: "EmptyChain",
	kindLeafOnly: "LeafOnly", kindExpired: "Expired", kindNotYetValid: "NotYetValid",
	kindWrongKey: "WrongKey", kindUntrusted: "Untrusted", kindGarbage: "Garbage",
}

// The answers a Server can be set to give. They are values: assign them,
// never modify them.
var (
	// OK signs the CSR's identity for the requested TTL: leaf,
	// intermediates, then the root bundle.
	OK = Mode{}
	// WrongIdentity signs a leaf for another identity (same trust domain
	// and namespace, service account + "-impostor").
	WrongIdentity = Mode{kind: kindWrongIdentity}
	// EmptyChain answers an empty cert_chain.
	EmptyChain = Mode{kind: kindEmptyChain}
	// LeafOnly answers the leaf alone, without a root.
	LeafOnly = Mode{kind: kindLeafOnly}
	// Expired answers a leaf that expired an hour ago.
	Expired = Mode{kind: kindExpired}
	// NotYetValid answers a leaf valid only from an hour from now.
	NotYetValid = Mode{kind: kindNotYetValid}
	// WrongKey answers a leaf for a key other than the CSR's.
	WrongKey = Mode{kind: kindWrongKey}
	// Untrusted answers a leaf signed by another CA than the returned roots.
	Untrusted = Mode{kind: kindUntrusted}
	// Garbage answers elements that are not PEM.
	Garbage = Mode{kind: kindGarbage}
)

// Error answers every request with gRPC status code.
func Error(code codes.Code) Mode { return Mode{kind: kindError, code: code} }

// Delay waits d (or until the request is cancelled), then answers OK.
func Delay(d time.Duration) Mode { return Mode{delay: d} }

// answer builds the cert_chain for request r in mode k at now.
func answer(ctx context.Context, k kind, ca *localca.CA, roots []*x509.Certificate, r Request, now time.Time) ([]string, error) {
	switch k {
	case kindEmptyChain:
		return nil, nil
	case kindGarbage:
		return []string{"not a certificate", "nor this"}, nil
	}
	if r.Identity.IsZero() {
		return nil, errors.New("CSR has no SPIFFE identity")
	}
	id, pub := r.Identity, r.CSR.PublicKey
	ttl := r.TTL
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	notBefore, notAfter := now, now.Add(ttl)
	switch k {
	case kindWrongIdentity:
		id.ServiceAccount += "-impostor"
	case kindExpired:
		notBefore, notAfter = now.Add(-2*time.Hour), now.Add(-time.Hour)
	case kindNotYetValid:
		notBefore, notAfter = now.Add(time.Hour), now.Add(2*time.Hour)
	case kindWrongKey:
		other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		pub = other.Public()
	case kindUntrusted:
		other, err := localca.New(localca.Config{})
		if err != nil {
			return nil, err
		}
		ca = other
	}
	leaf, err := signLeaf(ctx, ca, pub, id, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	chain := []string{encode(leaf)}
	if k == kindLeafOnly {
		return chain, nil
	}
	for _, c := range ca.Intermediates() {
		chain = append(chain, encode(c))
	}
	return append(chain, encode(roots...)), nil
}

// signLeaf signs a workload leaf for pub carrying exactly id.
func signLeaf(ctx context.Context, ca *localca.CA, pub crypto.PublicKey, id identity.Identity, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	u, err := url.Parse(id.String())
	if err != nil {
		return nil, err
	}
	return ca.IssueWithTemplate(ctx, publicOnly{pub}, &x509.Certificate{
		URIs:                  []*url.URL{u},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	})
}

// publicOnly carries a CSR's public key to localca.IssueWithTemplate, which
// uses only Public.
type publicOnly struct{ pub crypto.PublicKey }

func (p publicOnly) Public() crypto.PublicKey { return p.pub }

func (p publicOnly) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("istiocatest: public key only")
}

// parseCSR parses and checks the signature of a PEM CSR.
func parseCSR(s string) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("no PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	return csr, nil
}

func encode(cs ...*x509.Certificate) string {
	var out []byte
	for _, c := range cs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return string(out)
}

// ServerTLS returns a server TLS configuration whose certificate, signed by
// ca, is valid for names (DNS names, or IP addresses in text form).
func ServerTLS(tb testing.TB, ca *localca.CA, names ...string) *tls.Config {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("istiocatest: %v", err)
	}
	tmpl := &x509.Certificate{
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	leaf, err := ca.IssueWithTemplate(context.Background(), key, tmpl)
	if err != nil {
		tb.Fatalf("istiocatest: server certificate: %v", err)
	}
	chain := [][]byte{leaf.Raw}
	for _, c := range ca.Intermediates() {
		chain = append(chain, c.Raw)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key, Leaf: leaf}},
	}
}

// ClientTLS returns a client TLS configuration that trusts ca's roots and
// expects ServerName, for istioca.Config.TLS.
func ClientTLS(ca *localca.CA) *tls.Config {
	pool := x509.NewCertPool()
	for _, r := range ca.Roots() {
		pool.AddCert(r)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: ServerName}
}
