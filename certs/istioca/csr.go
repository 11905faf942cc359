package istioca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/istiod"
)

// oidSubjectAltName is id-ce-subjectAltName (RFC 5280 §4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// tagURI is the GeneralName tag of uniformResourceIdentifier ([6] IA5String).
const tagURI = 6

// newCSR makes a fresh ECDSA P-256 key and a PEM "CERTIFICATE REQUEST" for
// id (SPEC §6.2): empty subject, SHA-256 signature, and one extension
// request, a critical subjectAltName holding exactly one URI, id.
//
// The SAN is built here rather than from CertificateRequest.URIs because
// crypto/x509 marks it non-critical, while RFC 5280 §4.2.1.6 requires it to
// be critical when the subject is empty (as ztunnel's CSRs do).
func newCSR(id identity.Identity) (*ecdsa.PrivateKey, []byte, error) {
	s := id.String()
	if !istiod.ValidValue(s) || s == "" {
		return nil, nil, fmt.Errorf("identity %q is not printable ASCII", s)
	}
	san, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: tagURI, Bytes: []byte(s)}})
	if err != nil {
		return nil, nil, fmt.Errorf("encode SAN: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	tmpl := &x509.CertificateRequest{
		SignatureAlgorithm: x509.ECDSAWithSHA256,
		ExtraExtensions:    []pkix.Extension{{Id: oidSubjectAltName, Critical: true, Value: san}},
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}
