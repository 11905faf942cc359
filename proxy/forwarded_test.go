package proxy

import (
	"net/netip"
	"strings"
	"testing"
)

// forwardedCases are Forwarded headers (one or more field values) and the
// for= IP of their last element, "" for none.
var forwardedCases = []struct {
	name   string
	fields []string
	want   string
}{
	// RFC 7239 §4 and §7.4 examples.
	{"ipv4 token", []string{`for=192.0.2.43`}, "192.0.2.43"},
	{"quoted ipv4", []string{`for="192.0.2.43"`}, "192.0.2.43"},
	{"quoted ipv4 port", []string{`for="192.0.2.43:80"`}, "192.0.2.43"},
	{"quoted ipv6", []string{`for="[2001:db8:cafe::17]"`}, "2001:db8:cafe::17"},
	{"quoted ipv6 port", []string{`For="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
	{"pairs", []string{`for=192.0.2.60;proto=http;by=203.0.113.43`}, "192.0.2.60"},
	{"for not first", []string{`proto=https;for=192.0.2.60`}, "192.0.2.60"},
	{"list, last wins", []string{`for=192.0.2.43, for=198.51.100.17`}, "198.51.100.17"},
	{"list of mixed forms", []string{`for=192.0.2.43, for="[2001:db8:cafe::17]";proto=https`}, "2001:db8:cafe::17"},
	{"gozt outbound form", []string{`for="10.0.0.3:43210";host=echo.demo.svc.cluster.local`}, "10.0.0.3"},
	{"case-insensitive name", []string{`FOR=192.0.2.1`}, "192.0.2.1"},
	{"ows around separators", []string{" for=192.0.2.1 ; proto=http ,\tfor=192.0.2.2 "}, "192.0.2.2"},
	{"empty list elements", []string{`, for=192.0.2.1 ,, `}, "192.0.2.1"},
	{"empty pairs", []string{`;for=192.0.2.1;;`}, "192.0.2.1"},
	{"several fields are one list", []string{`for=192.0.2.1`, `for=192.0.2.2;proto=http`}, "192.0.2.2"},
	{"empty last field", []string{`for=192.0.2.1`, ``}, "192.0.2.1"},
	{"quoted-pair", []string{`for="\192.0.2.\1"`}, "192.0.2.1"},
	{"mapped ipv6 unmapped", []string{`for="[::ffff:192.0.2.1]"`}, "192.0.2.1"},
	{"obfuscated port", []string{`for="192.0.2.1:_gazonk"`}, "192.0.2.1"},
	{"extension parameter repeats", []string{`for=192.0.2.1;ext=a;ext=b`}, "192.0.2.1"},
	{"escaped quote in another value", []string{`host="a\"b";for=192.0.2.1`}, "192.0.2.1"},
	{"comma inside a quoted value", []string{`for=192.0.2.1;ext="x, for=192.0.2.66"`}, "192.0.2.1"},

	// The last element has no usable for=: no address, whatever came before.
	{"unknown last", []string{`for=192.0.2.43, for=unknown`}, ""},
	{"unknown quoted", []string{`for="unknown"`}, ""},
	{"unknown with port", []string{`for="unknown:80"`}, ""},
	{"obfuscated node", []string{`for=_hidden, for=_SEVKISEK`}, ""},
	{"obfuscated node with port", []string{`for="_gazonk:1234"`}, ""},
	{"last element without for", []string{`for=192.0.2.43, proto=https`}, ""},
	{"last element empty pairs", []string{`for=192.0.2.43, ;`}, ""},
	{"no for", []string{`proto=https;by=192.0.2.1`}, ""},
	{"hostname", []string{`for=client.example.com`}, ""},
	{"ipv6 not bracketed", []string{`for="2001:db8::1"`}, ""},
	{"ipv4 bracketed", []string{`for="[192.0.2.1]"`}, ""},
	{"ipv6 zone", []string{`for="[fe80::1%eth0]"`}, ""},
	{"ipv4 leading zero", []string{`for=192.0.2.01`}, ""},
	{"ipv4 short", []string{`for=192.0.2`}, ""},
	{"port too long", []string{`for="192.0.2.1:123456"`}, ""},
	{"empty port", []string{`for="192.0.2.1:"`}, ""},
	{"ipv6 empty port", []string{`for="[2001:db8::1]:"`}, ""},
	{"port not digits", []string{`for="192.0.2.1:8o"`}, ""},
	{"bad obfuscated port", []string{`for="192.0.2.1:_"`}, ""},
	{"junk after bracket", []string{`for="[2001:db8::1]x"`}, ""},
	{"unterminated bracket", []string{`for="[2001:db8::1"`}, ""},
	{"empty quoted", []string{`for=""`}, ""},
	{"absent", nil, ""},
	{"empty", []string{``}, ""},

	// Malformed anywhere: the whole header is ignored.
	{"unquoted port", []string{`for=192.0.2.43:80`}, ""},
	{"unquoted ipv6", []string{`for=[2001:db8:cafe::17]`}, ""},
	{"no value", []string{`for=`}, ""},
	{"no name", []string{`=192.0.2.1`}, ""},
	{"no equals", []string{`abc`}, ""},
	{"space before equals", []string{`for =192.0.2.1`}, ""},
	{"space after equals", []string{`for= 192.0.2.1`}, ""},
	{"two for in one element", []string{`for=192.0.2.1;for=192.0.2.2`}, ""},
	{"two for, differing case", []string{`for=192.0.2.1;FOR=192.0.2.2`}, ""},
	{"two proto in one element", []string{`for=192.0.2.1;proto=http;proto=https`}, ""},
	{"pairs without separator", []string{`for=192.0.2.1 proto=http`}, ""},
	{"unterminated quote", []string{`for="192.0.2.1`}, ""},
	{"quote split over fields", []string{`for="192.0.2.1`, `"`}, ""},
	{"malformed earlier element", []string{`for=[::1], for=192.0.2.1`}, ""},
	{"malformed earlier field", []string{`for="x`, `for=192.0.2.1`}, ""},
	{"malformed later field", []string{`for=192.0.2.1`, `;=`}, ""},
	{"control character in quotes", []string{"for=\"192.0.2.1\x00\""}, ""},
	{"bad quoted-pair", []string{"for=\"\\\x01\""}, ""},
	{"trailing backslash", []string{`for="192.0.2.1\`}, ""},
	{"junk after quoted value", []string{`for="192.0.2.1"x`}, ""},
	{"non-tchar in token", []string{`for=192.0.2.1/32`}, ""},
}

func TestForwardedFor(t *testing.T) {
	for _, tc := range forwardedCases {
		t.Run(tc.name, func(t *testing.T) {
			got := forwardedFor(tc.fields)
			want := netip.Addr{}
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got != want {
				t.Errorf("forwardedFor(%q) = %v, want %v", tc.fields, got, want)
			}
		})
	}
}

// TestForwardedForNoAllocs: reading the header is free unless a for= value
// holds quoted-pairs (STYLE 38: it runs on every CONNECT from a waypoint).
func TestForwardedForNoAllocs(t *testing.T) {
	for _, fields := range [][]string{
		{`for="10.0.0.3:43210";host=echo.demo.svc.cluster.local`},
		{`for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https`},
		{`for=unknown`},
		{`for="x`},
	} {
		if n := testing.AllocsPerRun(100, func() { forwardedFor(fields) }); n != 0 {
			t.Errorf("forwardedFor(%q) allocates %v times, want 0", fields, n)
		}
	}
}

// FuzzForwardedFor checks properties of the parser on arbitrary headers:
// it never panics; an IPv4 address it returns is written in the header
// (unless bracketed or escaped); appending an element without a for= IP removes it; prepending a
// well-formed element never changes it. And the header our outbound side
// builds (SPEC §2.3) always reads back as its client's IP.
func FuzzForwardedFor(f *testing.F) {
	for _, tc := range forwardedCases {
		f.Add(strings.Join(tc.fields, ", "), []byte{10, 0, 0, 3}, uint16(43210), "echo.demo.svc.cluster.local")
	}
	f.Add(`for="[2001:db8::1]:1"`, []byte(netip.MustParseAddr("2001:db8::17").AsSlice()), uint16(1), "")
	f.Fuzz(func(t *testing.T, h string, ip []byte, port uint16, host string) {
		got := forwardedFor([]string{h})
		if got.IsValid() {
			if got.Zone() != "" || got.Is4In6() {
				t.Fatalf("forwardedFor(%q) = %v: zoned or mapped", h, got)
			}
			if got.Is4() && !strings.ContainsAny(h, `[\`) && !strings.Contains(h, got.String()) {
				t.Fatalf("forwardedFor(%q) = %v, which the header does not contain", h, got)
			}
			if after := forwardedFor([]string{h + ", for=unknown"}); after.IsValid() {
				t.Fatalf("forwardedFor(%q + unknown) = %v, want none", h, after)
			}
			if before := forwardedFor([]string{`for=192.0.2.99;proto=http, ` + h}); before != got {
				t.Fatalf("forwardedFor(element + %q) = %v, want %v", h, before, got)
			}
		}
		a, ok := netip.AddrFromSlice(ip)
		if !ok || !validHostname(host) && host != "" {
			return
		}
		built := forwarded(netip.AddrPortFrom(a, port), host)
		if got := forwardedFor([]string{built}); got != a.Unmap() {
			t.Fatalf("forwardedFor(forwarded(%v, %q) = %q) = %v, want %v", a, host, built, got, a.Unmap())
		}
	})
}
