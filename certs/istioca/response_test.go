package istioca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

var testID = identity.MustParse("spiffe://cluster.local/ns/a/sa/a")

func genKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mkCert signs tmpl for pub with parent/parentKey (self-signed when parent
// is nil).
func mkCert(t testing.TB, tmpl *x509.Certificate, pub crypto.PublicKey, parent *x509.Certificate, parentKey crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func caTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
}

func leafTemplate(uris ...string) *x509.Certificate {
	tmpl := &x509.Certificate{
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, u := range uris {
		p, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, p)
	}
	return tmpl
}

func pemOf(cs ...*x509.Certificate) string {
	var b strings.Builder
	for _, c := range cs {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.String()
}

// pki is two roots, an intermediate under the first, and a leaf for testID
// (with key) under the intermediate.
type pki struct {
	root1, root2, inter, leaf *x509.Certificate
	interKey, key             *ecdsa.PrivateKey
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	k1, k2, ki, kl := genKey(t), genKey(t), genKey(t), genKey(t)
	p := &pki{interKey: ki, key: kl}
	p.root1 = mkCert(t, caTemplate("root1"), k1.Public(), nil, k1)
	p.root2 = mkCert(t, caTemplate("root2"), k2.Public(), nil, k2)
	p.inter = mkCert(t, caTemplate("inter"), ki.Public(), p.root1, k1)
	p.leaf = mkCert(t, leafTemplate(testID.String()), kl.Public(), p.inter, ki)
	return p
}

func TestParseResponse(t *testing.T) {
	p := newPKI(t)
	other := genKey(t)
	twoSANs := mkCert(t, leafTemplate(testID.String(), "spiffe://cluster.local/ns/b/sa/b"), p.key.Public(), p.inter, p.interKey)
	caLeaf := mkCert(t, caTemplate("leaf-ca"), p.key.Public(), p.inter, p.interKey)
	tooMany := make([]string, maxChainCerts)
	for i := range tooMany {
		tooMany[i] = pemOf(p.inter)
	}
	tooMany[0] = pemOf(p.leaf)
	tests := []struct {
		name      string
		chain     []string
		key       crypto.Signer
		want      error
		wantChain int
	}{
		{"leaf, intermediate, two roots", []string{pemOf(p.leaf), pemOf(p.inter), pemOf(p.root2, p.root1)}, p.key, nil, 2},
		{"intermediate in the leaf element", []string{pemOf(p.leaf, p.inter), pemOf(p.root1)}, p.key, nil, 2},
		{"intermediate missing", []string{pemOf(p.leaf), pemOf(p.root1)}, p.key, certs.ErrUntrusted, 0},
		{"wrong root", []string{pemOf(p.leaf), pemOf(p.inter), pemOf(p.root2)}, p.key, certs.ErrUntrusted, 0},
		{"leaf only", []string{pemOf(p.leaf, p.inter)}, p.key, certs.ErrNoRoots, 0},
		{"empty", nil, p.key, certs.ErrEmptyChain, 0},
		{"two URI SANs", []string{pemOf(twoSANs), pemOf(p.inter), pemOf(p.root1)}, p.key, certs.ErrIdentityMismatch, 0},
		{"CA leaf", []string{pemOf(caLeaf), pemOf(p.inter), pemOf(p.root1)}, p.key, certs.ErrBadLeaf, 0},
		{"other key", []string{pemOf(p.leaf), pemOf(p.inter), pemOf(p.root1)}, other, certs.ErrKeyMismatch, 0},
		{"private key block", []string{pemOf(p.leaf), "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, p.key, ErrBadResponse, 0},
		{"empty element", []string{pemOf(p.leaf), "", pemOf(p.root1)}, p.key, ErrBadResponse, 0},
		{"bad DER", []string{pemOf(p.leaf), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, p.key, ErrBadResponse, 0},
		{"too many certificates", append(tooMany, pemOf(p.root1)), p.key, ErrBadResponse, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseResponse(testID, tt.key, tt.chain, time.Now(), nil)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("parseResponse = %v, %v; want %v", c, err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseResponse: %v", err)
			}
			if chain := c.Chain(); len(chain) != tt.wantChain || !chain[0].Equal(p.leaf) {
				t.Errorf("served chain has %d certs, want %d starting with the leaf", len(chain), tt.wantChain)
			}
		})
	}
}

func TestParseResponseTime(t *testing.T) {
	p := newPKI(t)
	chain := []string{pemOf(p.leaf), pemOf(p.inter), pemOf(p.root1)}
	if _, err := parseResponse(testID, p.key, chain, p.leaf.NotAfter, nil); !errors.Is(err, certs.ErrExpired) {
		t.Errorf("at NotAfter: %v, want ErrExpired", err)
	}
	if _, err := parseResponse(testID, p.key, chain, p.leaf.NotBefore.Add(-time.Second), nil); !errors.Is(err, certs.ErrUntrusted) {
		t.Errorf("before NotBefore: %v, want ErrUntrusted", err)
	}
}

// FuzzParseResponse feeds arbitrary cert_chain elements: parseResponse
// must not panic, and anything it accepts is a cert for exactly the
// requested identity and key.
func FuzzParseResponse(f *testing.F) {
	p := newPKI(f)
	f.Add(pemOf(p.leaf), pemOf(p.inter), pemOf(p.root1, p.root2))
	f.Add(pemOf(p.leaf, p.inter), "", pemOf(p.root1))
	f.Add("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n", "x", "")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		for _, chain := range [][]string{{a}, {a, c}, {a, b, c}} {
			cert, err := parseResponse(testID, p.key, chain, time.Now(), nil)
			if err != nil {
				continue
			}
			if cert.Identity != testID || !cert.Chain()[0].PublicKey.(*ecdsa.PublicKey).Equal(p.key.Public()) {
				t.Fatalf("accepted a cert for %v / another key", cert.Identity)
			}
		}
	})
}
