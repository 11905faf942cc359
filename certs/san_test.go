package certs

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// certWithSAN fakes a parsed certificate whose SAN extension is value and
// whose URIs are uris, to test uriSANs independently of crypto/x509's own
// parser (which already refuses control bytes).
func certWithSAN(t *testing.T, names []asn1.RawValue, uris ...string) *x509.Certificate {
	t.Helper()
	val, err := asn1.Marshal(names)
	if err != nil {
		t.Fatal(err)
	}
	c := &x509.Certificate{Extensions: []pkix.Extension{{Id: oidSubjectAltName, Value: val}}}
	for _, s := range uris {
		c.URIs = append(c.URIs, &url.URL{Opaque: s})
	}
	return c
}

func uriName(s string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagURI, Bytes: []byte(s)}
}

func dnsName(s string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte(s)}
}

func TestURISANs(t *testing.T) {
	c := certWithSAN(t, []asn1.RawValue{dnsName("x"), uriName("spiffe://td/ns/a/sa/b"), uriName("spiffe://td/ns/%41/sa/b")}, "1", "2")
	got, err := uriSANs(c)
	if err != nil {
		t.Fatal(err)
	}
	// Raw strings, not net/url's re-encoding.
	if diff := cmp.Diff([]string{"spiffe://td/ns/a/sa/b", "spiffe://td/ns/%41/sa/b"}, got); diff != "" {
		t.Errorf("uriSANs (-want +got):\n%s", diff)
	}
}

func TestURISANsRejectsControlBytes(t *testing.T) {
	for _, s := range []string{"spiffe://td/ns/a/sa/b\x00x", "spiffe://td/ns/a/sa/b\n", "spiffe://td/ns/a /sa/b", "spiffe://td/ns/\xc3\xa4/sa/b"} {
		c := certWithSAN(t, []asn1.RawValue{uriName(s)}, s)
		if got, err := uriSANs(c); !errors.Is(err, ErrNoSPIFFEID) {
			t.Errorf("uriSANs(%q) = %q, %v; want ErrNoSPIFFEID", s, got, err)
		}
	}
}

func TestURISANsRejectsDisagreement(t *testing.T) {
	// x509 saw no URIs but the extension has one: refuse.
	c := certWithSAN(t, []asn1.RawValue{uriName("spiffe://td/ns/a/sa/b")})
	if _, err := uriSANs(c); !errors.Is(err, ErrNoSPIFFEID) {
		t.Errorf("uriSANs(mismatch) = %v, want ErrNoSPIFFEID", err)
	}
	bad := &x509.Certificate{Extensions: []pkix.Extension{{Id: oidSubjectAltName, Value: []byte{0x30, 0x05, 0x86}}}}
	if _, err := uriSANs(bad); !errors.Is(err, ErrNoSPIFFEID) {
		t.Errorf("uriSANs(malformed) = %v, want ErrNoSPIFFEID", err)
	}
}

func FuzzURISANs(f *testing.F) {
	for _, names := range [][]asn1.RawValue{
		{uriName("spiffe://td/ns/a/sa/b")},
		{dnsName("x"), uriName("spiffe://td/ns/a/sa/b\x00x")},
		{uriName("a"), uriName("b")},
	} {
		val, err := asn1.Marshal(names)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(val, len(names))
	}
	f.Fuzz(func(t *testing.T, val []byte, nURIs int) {
		c := &x509.Certificate{Extensions: []pkix.Extension{{Id: oidSubjectAltName, Value: val}}}
		for range min(max(nURIs, 0), 8) {
			c.URIs = append(c.URIs, &url.URL{})
		}
		got, err := uriSANs(c)
		if err != nil {
			return
		}
		if len(got) != len(c.URIs) {
			t.Fatalf("uriSANs returned %d names for %d URIs", len(got), len(c.URIs))
		}
		for _, s := range got {
			if !isPrintableASCII([]byte(s)) {
				t.Fatalf("uriSANs returned %q", s)
			}
		}
	})
}

// otherName is an otherName SAN of type oid with a UTF8String value.
func otherName(t *testing.T, oid asn1.ObjectIdentifier, v string) asn1.RawValue {
	t.Helper()
	inner, err := asn1.MarshalWithParams(v, "utf8")
	if err != nil {
		t.Fatal(err)
	}
	o, err := asn1.Marshal(oid)
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: inner})
	if err != nil {
		t.Fatal(err)
	}
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagOtherName, IsCompound: true, Bytes: append(o, explicit...)}
}

// TestSANsRejectControlBytesInOtherNames (TESTPLAN 33): a NUL in a DNS,
// email or otherName SAN beside a valid URI SAN fails, as the TLS configs
// promise; the same names without it pass.
func TestSANsRejectControlBytesInOtherNames(t *testing.T) {
	const id = "spiffe://td/ns/a/sa/b"
	upn := asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3}
	for _, tc := range []struct {
		name  asn1.RawValue
		valid bool
	}{
		{dnsName("client.evil"), true},
		{dnsName("client\x00.evil"), false},
		{asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagRFC822, Bytes: []byte("a@b\x00c")}, false},
		{asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagRFC822, Bytes: []byte("a@b.c")}, true},
		{otherName(t, upn, id), true},
		{otherName(t, upn, id+"\x00x"), false},
		{otherName(t, upn, "tab\there"), false},
		{asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tagOtherName, IsCompound: true, Bytes: []byte{0x06, 0x01}}, false},
	} {
		c := certWithSAN(t, []asn1.RawValue{uriName(id), tc.name}, id)
		got, err := uriSANs(c)
		if tc.valid && (err != nil || len(got) != 1 || got[0] != id) {
			t.Errorf("uriSANs with %x = %q, %v; want [%s]", tc.name.Bytes, got, err, id)
		}
		if !tc.valid && !errors.Is(err, ErrNoSPIFFEID) {
			t.Errorf("uriSANs with %q = %q, %v; want ErrNoSPIFFEID", tc.name.Bytes, got, err)
		}
	}
}
