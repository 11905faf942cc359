package certs

import (
	"crypto/x509"
	"encoding/asn1"
	"fmt"
)

// oidSubjectAltName is id-ce-subjectAltName (RFC 5280 §4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// tagURI is the GeneralName CHOICE tag of uniformResourceIdentifier
// ([6] IA5String, RFC 5280 §4.2.1.6).
const tagURI = 6

// uriSANs returns the URI SANs of cert exactly as encoded, without the
// normalisation that net/url applies to cert.URIs. Any URI SAN holding a
// control byte (NUL included) or non-ASCII byte is an error, never a
// truncated or skipped entry (TESTPLAN S18). crypto/x509 already refuses to
// parse such certificates; this is a second, independent check.
func uriSANs(cert *x509.Certificate) ([]string, error) {
	var out []string
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		var seq asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &seq)
		if err != nil || len(rest) != 0 || seq.Class != asn1.ClassUniversal ||
			seq.Tag != asn1.TagSequence || !seq.IsCompound {
			return nil, fmt.Errorf("%w: malformed subjectAltName", ErrNoSPIFFEID)
		}
		for data := seq.Bytes; len(data) > 0; {
			var name asn1.RawValue
			data, err = asn1.Unmarshal(data, &name)
			if err != nil {
				return nil, fmt.Errorf("%w: malformed subjectAltName", ErrNoSPIFFEID)
			}
			if name.Class != asn1.ClassContextSpecific || name.Tag != tagURI {
				continue
			}
			if !isPrintableASCII(name.Bytes) {
				return nil, fmt.Errorf("%w: URI SAN %q has control or non-ASCII bytes", ErrNoSPIFFEID, name.Bytes)
			}
			out = append(out, string(name.Bytes))
		}
	}
	if len(out) != len(cert.URIs) {
		// x509 and our reading disagree; refuse rather than guess.
		return nil, fmt.Errorf("%w: inconsistent URI SANs", ErrNoSPIFFEID)
	}
	return out, nil
}

// isPrintableASCII reports whether b holds only printable ASCII (0x21–0x7e).
func isPrintableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
