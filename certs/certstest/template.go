// Package certstest provides certificate templates for tests that mint
// workload certificates by hand, well-formed or deliberately broken, for
// certs' own tests and for those that present such certificates to a whole
// gozt. It imports testing; the gozt binary never links it.
package certstest

import (
	"crypto/x509"
	"net/url"
	"testing"
	"time"
)

// LeafTemplate returns a well-formed workload leaf template, valid from a
// minute ago for an hour, with uris as its URI SANs; tests then break one
// property. It fails t if a URI does not parse.
func LeafTemplate(t testing.TB, uris ...string) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	return tmpl
}
