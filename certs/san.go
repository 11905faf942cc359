package certs

import (
	"crypto/x509"
	"encoding/asn1"
	"fmt"
)

// oidSubjectAltName is id-ce-subjectAltName (RFC 5280 §4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// GeneralName CHOICE tags (RFC 5280 §4.2.1.6).
const (
	tagOtherName = 0 // [0] OtherName: type-id OID, [0] EXPLICIT value
	tagRFC822    = 1 // [1] IA5String
	tagDNS       = 2 // [2] IA5String
	tagURI       = 6 // [6] IA5String
)

// uriSANs returns the URI SANs of cert exactly as encoded, without the
// normalisation that net/url applies to cert.URIs. Any URI SAN holding a
// control byte (NUL included) or non-ASCII byte is an error, never a
// truncated or skipped entry (TESTPLAN S18), and so is a DNS, email or
// otherName SAN holding a control byte: a name another verifier might read
// truncated at a NUL is refused outright (TESTPLAN 33). crypto/x509
// already refuses to parse URI SANs with such bytes; this is a second,
// independent check.
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
			if name.Class != asn1.ClassContextSpecific {
				continue
			}
			switch name.Tag {
			case tagRFC822, tagDNS:
				if hasControlByte(name.Bytes) {
					return nil, fmt.Errorf("%w: SAN %q has control bytes", ErrNoSPIFFEID, name.Bytes)
				}
				continue
			case tagOtherName:
				if err := checkOtherName(name.Bytes); err != nil {
					return nil, err
				}
				continue
			case tagURI:
			default:
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

// checkOtherName refuses an otherName SAN (its contents: type-id OID, then
// [0] EXPLICIT value) that does not parse or whose value's bytes hold a
// control byte.
func checkOtherName(b []byte) error {
	var oid asn1.ObjectIdentifier
	rest, err := asn1.Unmarshal(b, &oid)
	if err == nil {
		var val asn1.RawValue
		rest, err = asn1.Unmarshal(rest, &val)
		if err == nil && len(rest) == 0 && val.Class == asn1.ClassContextSpecific && val.Tag == 0 && val.IsCompound {
			var inner asn1.RawValue
			if rest, err = asn1.Unmarshal(val.Bytes, &inner); err == nil && len(rest) == 0 {
				if !inner.IsCompound && hasControlByte(inner.Bytes) {
					return fmt.Errorf("%w: otherName SAN %s has control bytes", ErrNoSPIFFEID, oid)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("%w: malformed otherName SAN", ErrNoSPIFFEID)
}

// hasControlByte reports whether b holds a C0 control byte or DEL.
func hasControlByte(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == 0x7f {
			return true
		}
	}
	return false
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
