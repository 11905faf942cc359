// Package localca is a small certificate authority for `gozt local`,
// `gozt bench` and tests. It issues SPIFFE workload certificates
// (certs.Issuer) from a self-signed ECDSA P-256 root, or from a CA loaded
// from a directory in Istio's cacerts layout (ca-cert.pem, ca-key.pem,
// root-cert.pem, cert-chain.pem).
package localca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

// Config configures a CA.
type Config struct {
	// Dir, if non-empty, holds the CA in Istio's cacerts layout
	// (ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem). If none of
	// those files exist, a new self-signed root is created and written
	// there (key mode 0600). If empty, the root lives in memory only.
	Dir string
	// TTL is the leaf lifetime. If zero, 24h is used.
	TTL time.Duration
	// Now is the clock for validity periods. If nil, time.Now is used.
	// Issued certificates must still be valid at the real time, because
	// certs.NewCert checks them at time.Now().
	Now func() time.Time
}

const (
	defaultTTL = 24 * time.Hour
	// rootLifetime is the validity of a generated root.
	rootLifetime = 10 * 365 * 24 * time.Hour
	// backdate moves NotBefore into the past to tolerate clock skew
	// between nodes.
	backdate = time.Minute
)

func (c *Config) ttl() time.Duration {
	if c.TTL <= 0 {
		return defaultTTL
	}
	return c.TTL
}

func (c *Config) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

// CA issues workload certificates. It is safe for concurrent use; its
// fields are set in New and never change.
type CA struct {
	cfg           Config
	signer        *x509.Certificate   // signs leaves (root or intermediate)
	key           crypto.Signer       // signer's key
	intermediates []*x509.Certificate // served after the leaf: signer (if not a root) and its chain
	roots         []*x509.Certificate // trust anchors
}

var _ certs.Issuer = (*CA)(nil)

// New returns a CA: an ECDSA P-256 self-signed root when cfg.Dir is empty
// or holds no CA files, otherwise the CA loaded from cfg.Dir.
func New(cfg Config) (*CA, error) {
	if cfg.Dir == "" {
		ca, err := newRoot(cfg)
		if err != nil {
			return nil, fmt.Errorf("localca: %w", err)
		}
		return ca, nil
	}
	ca, err := loadOrCreate(cfg)
	if err != nil {
		return nil, fmt.Errorf("localca: %w", err)
	}
	return ca, nil
}

// newRoot makes a CA with a fresh self-signed root.
func newRoot(cfg Config) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate root key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := cfg.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"gozt"}, CommonName: "gozt local root CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(rootLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create root: %w", err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse root: %w", err)
	}
	return &CA{cfg: cfg, signer: root, key: key, roots: []*x509.Certificate{root}}, nil
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// Issue implements certs.Issuer: a fresh P-256 key and a leaf with exactly
// one URI SAN (id), an empty subject, KeyUsage digitalSignature and
// ExtKeyUsage server and client auth, valid for the TTL (capped at the
// signing CA's expiry).
func (ca *CA) Issue(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("localca: issue %v: %w", id, err)
	}
	u, err := spiffeURL(id)
	if err != nil {
		return nil, fmt.Errorf("localca: issue: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("localca: issue %v: %w", id, err)
	}
	now := ca.cfg.now()
	tmpl := &x509.Certificate{
		URIs:                  []*url.URL{u},
		NotBefore:             now.Add(-backdate),
		NotAfter:              minTime(now.Add(ca.cfg.ttl()), ca.signer.NotAfter),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	leaf, err := ca.IssueWithTemplate(ctx, key, tmpl)
	if err != nil {
		return nil, fmt.Errorf("localca: issue %v: %w", id, err)
	}
	chain := append([]*x509.Certificate{leaf}, ca.intermediates...)
	c, err := certs.NewCert(id, chain, key, ca.roots)
	if err != nil {
		return nil, fmt.Errorf("localca: issue %v: %w", id, err)
	}
	return c, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// spiffeURL converts id to a URL that x509 encodes as exactly id.String().
func spiffeURL(id identity.Identity) (*url.URL, error) {
	s := id.String()
	if _, err := identity.Parse(s); err != nil {
		return nil, err
	}
	u, err := url.Parse(s)
	if err != nil || u.String() != s {
		return nil, fmt.Errorf("identity %q does not round-trip as a URL", s)
	}
	return u, nil
}

// IssueWithTemplate signs tmpl for key's public key with the CA's signing
// key, without the checks Issue makes, so tests can mint deliberately odd
// certificates (several SANs, expired, CA leaves). A nil SerialNumber is
// replaced with a random one. NotAfter is not capped.
func (ca *CA) IssueWithTemplate(ctx context.Context, key crypto.Signer, tmpl *x509.Certificate) (*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if key == nil || tmpl == nil {
		return nil, errors.New("localca: nil key or template")
	}
	t := *tmpl
	if t.SerialNumber == nil {
		serial, err := randomSerial()
		if err != nil {
			return nil, err
		}
		t.SerialNumber = serial
	}
	der, err := x509.CreateCertificate(rand.Reader, &t, ca.signer, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return x509.ParseCertificate(der)
}

// Roots returns the trust anchors (a copy of the slice).
func (ca *CA) Roots() []*x509.Certificate {
	return append([]*x509.Certificate(nil), ca.roots...)
}

// Intermediates returns the certificates served after each leaf (a copy of
// the slice; empty when leaves are signed by the root).
func (ca *CA) Intermediates() []*x509.Certificate {
	return append([]*x509.Certificate(nil), ca.intermediates...)
}

// RootPEM returns the trust anchors PEM-encoded, as in root-cert.pem.
func (ca *CA) RootPEM() []byte {
	return encodeCerts(ca.roots)
}

// encodeCerts PEM-encodes certs as CERTIFICATE blocks.
func encodeCerts(cs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range cs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}
