package proxy

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	proxyproto "github.com/pires/go-proxyproto"
)

const testPeerID = "spiffe://cluster.local/ns/demo/sa/client"

// parsedHeader is what a PROXY v2 parser we did not write (go-proxyproto)
// reads from a header appendProxyHeader wrote.
type parsedHeader struct {
	Version  byte
	Command  proxyproto.ProtocolVersionAndCommand
	Family   proxyproto.AddressFamilyAndProtocol
	Src, Dst string
	TLVs     []proxyproto.TLV
	Rest     string // the bytes after the header
}

// parseWithGoProxyproto reads b (a header then payload) with go-proxyproto.
func parseWithGoProxyproto(t *testing.T, b []byte) (parsedHeader, error) {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(b))
	h, err := proxyproto.Read(r)
	if err != nil {
		return parsedHeader{}, err
	}
	tlvs, err := h.TLVs()
	if err != nil {
		t.Fatalf("go-proxyproto TLVs: %v", err)
	}
	rest, _ := io.ReadAll(r)
	p := parsedHeader{Version: h.Version, Command: h.Command, Family: h.TransportProtocol, TLVs: tlvs, Rest: string(rest)}
	src, dst, ok := h.TCPAddrs()
	if !ok {
		t.Fatalf("go-proxyproto read no TCP addresses from %x", b)
	}
	p.Src, p.Dst = addrString(src), addrString(dst)
	return p, nil
}

// addrString is a's ip:port, a 4-byte IPv4 address as IPv4 and a 16-byte
// address as IPv6 (so that an IPv4-mapped address stays IPv6).
func addrString(a *net.TCPAddr) string {
	ip, _ := netip.AddrFromSlice(a.IP)
	return netip.AddrPortFrom(ip, uint16(a.Port)).String()
}

// TestProxyHeaderParsed: go-proxyproto reads exactly the source,
// destination and TLV 0xD0 we write (SPEC §2.7), for IPv4 and IPv6, with
// and without a peer identity, and the payload after the header intact.
func TestProxyHeaderParsed(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst, id string
		family             proxyproto.AddressFamilyAndProtocol
	}{
		{"ipv4 with identity", "10.0.0.3:40000", "10.96.0.1:80", testPeerID, proxyproto.TCPv4},
		{"ipv4 without identity", "10.0.0.3:40000", "10.96.0.1:80", "", proxyproto.TCPv4},
		{"ipv6 with identity", "[fd00::3]:40000", "[fd00:96::1]:8080", testPeerID, proxyproto.TCPv6},
		{"ipv6 without identity", "[fd00::3]:65535", "[fd00:96::1]:1", "", proxyproto.TCPv6},
		{"ipv4-mapped is ipv6", "[::ffff:10.0.0.3]:40000", "[fd00:96::1]:80", testPeerID, proxyproto.TCPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst)
			hdr, err := appendProxyHeader(nil, src, dst, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseWithGoProxyproto(t, append(hdr, "payload"...))
			if err != nil {
				t.Fatalf("go-proxyproto Read(%x) = %v", hdr, err)
			}
			want := parsedHeader{Version: 2, Command: proxyproto.PROXY, Family: tc.family, Src: tc.src, Dst: tc.dst, Rest: "payload"}
			if tc.id != "" {
				want.TLVs = []proxyproto.TLV{{Type: proxyTLVPeerIdentity, Value: []byte(tc.id)}}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("appendProxyHeader(%s, %s, %q) as go-proxyproto reads it (-want +got):\n%s", src, dst, tc.id, diff)
			}
		})
	}
}

// TestProxyHeaderGolden: one header byte for byte against the layout of
// HAProxy's proxy-protocol.txt §2.2 and §2.2.7.
func TestProxyHeaderGolden(t *testing.T) {
	const id = "spiffe://td/ns/a/sa/b" // 21 bytes
	want := strings.Join([]string{
		"0d0a0d0a000d0a515549540a", // signature
		"21",                       // version 2, command PROXY
		"11",                       // AF_INET, STREAM
		"0024",                     // length: 12 address bytes + 3 + 21 TLV bytes = 36
		"c0000201",                 // source 192.0.2.1
		"c6336402",                 // destination 198.51.100.2
		"d431",                     // source port 54321
		"3a98",                     // destination port 15000
		"d0", "0015",               // TLV 0xD0, length 21
		hex.EncodeToString([]byte(id)),
	}, "")
	got, err := appendProxyHeader([]byte("kept"), netip.MustParseAddrPort("192.0.2.1:54321"), netip.MustParseAddrPort("198.51.100.2:15000"), id)
	if err != nil {
		t.Fatal(err)
	}
	if g := hex.EncodeToString(got); g != hex.EncodeToString([]byte("kept"))+want {
		t.Errorf("appendProxyHeader = %s, want %s after the existing bytes", g, want)
	}
}

// TestProxyHeaderMixedFamilies: a source and destination of different
// families give what ztunnel's ppp builder gives them, command PROXY with
// family AF_UNSPEC and no address block, only the TLV. go-proxyproto,
// which §2.2 allows to, refuses such a header; the TLV still reads.
func TestProxyHeaderMixedFamilies(t *testing.T) {
	for _, tc := range []struct{ name, src, dst, id, want string }{
		{"ipv4 peer, ipv6 destination", "10.0.0.3:40000", "[fd00:96::1]:80", "spiffe://td/ns/a/sa/b",
			"0d0a0d0a000d0a515549540a" + "21" + "01" + "0018" + "d00015" + hex.EncodeToString([]byte("spiffe://td/ns/a/sa/b"))},
		{"ipv6 peer, ipv4 destination", "[fd00::3]:40000", "10.96.0.1:80", "spiffe://td/ns/a/sa/b",
			"0d0a0d0a000d0a515549540a" + "21" + "01" + "0018" + "d00015" + hex.EncodeToString([]byte("spiffe://td/ns/a/sa/b"))},
		{"no identity", "10.0.0.3:40000", "[fd00:96::1]:80", "", "0d0a0d0a000d0a515549540a" + "21" + "01" + "0000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr, err := appendProxyHeader(nil, netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst), tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(hdr); got != tc.want {
				t.Fatalf("appendProxyHeader(%s, %s) = %s, want %s", tc.src, tc.dst, got, tc.want)
			}
			if _, err := parseWithGoProxyproto(t, hdr); !errors.Is(err, proxyproto.ErrUnsupportedAddressFamilyAndProtocol) {
				t.Errorf("go-proxyproto Read(%x) = %v, want %v", hdr, err, proxyproto.ErrUnsupportedAddressFamilyAndProtocol)
			}
			tlvs, err := proxyproto.SplitTLVs(hdr[proxyV2FixedLen:])
			var want []proxyproto.TLV
			if tc.id != "" {
				want = []proxyproto.TLV{{Type: proxyTLVPeerIdentity, Value: []byte(tc.id)}}
			}
			if diff := cmp.Diff(want, tlvs); err != nil || diff != "" {
				t.Errorf("go-proxyproto SplitTLVs = %v (-want +got):\n%s", err, diff)
			}
		})
	}
}

// TestProxyHeaderTooLong: a TLV that would overflow the 16-bit length is
// refused, and b is returned unchanged.
func TestProxyHeaderTooLong(t *testing.T) {
	src, dst := netip.MustParseAddrPort("[fd00::3]:1"), netip.MustParseAddrPort("[fd00::4]:2")
	fits := strings.Repeat("x", 0xFFFF-proxyAddrLen6-proxyTLVHeaderLen)
	if _, err := appendProxyHeader(nil, src, dst, fits); err != nil {
		t.Errorf("appendProxyHeader with the longest TLV = %v, want nil", err)
	}
	b, err := appendProxyHeader([]byte("kept"), src, dst, fits+"x")
	if !errors.Is(err, errProxyHeaderTooLong) || string(b) != "kept" {
		t.Errorf("appendProxyHeader one byte over = %q, %v; want %q, %v", b, err, "kept", errProxyHeaderTooLong)
	}
}

// TestProxyHeaderNoAllocs: with room in b, writing a header allocates
// nothing (STYLE 38).
func TestProxyHeaderNoAllocs(t *testing.T) {
	src, dst := netip.MustParseAddrPort("[fd00::3]:40000"), netip.MustParseAddrPort("[fd00:96::1]:80")
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := appendProxyHeader(buf, src, dst, testPeerID); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("appendProxyHeader allocates %v times, want 0", n)
	}
}

// FuzzProxyHeader: whatever the addresses, ports and identity, go-proxyproto
// reads back exactly what was written (same-family pairs), and the length
// field covers the whole header.
func FuzzProxyHeader(f *testing.F) {
	f.Add([]byte{10, 0, 0, 3}, []byte{10, 96, 0, 1}, uint16(40000), uint16(80), testPeerID)
	f.Add(netip.MustParseAddr("fd00::3").AsSlice(), netip.MustParseAddr("::ffff:10.0.0.1").AsSlice(), uint16(1), uint16(65535), "")
	f.Fuzz(func(t *testing.T, s, d []byte, sp, dp uint16, id string) {
		sa, ok1 := netip.AddrFromSlice(s)
		da, ok2 := netip.AddrFromSlice(d)
		if !ok1 || !ok2 || sa.Is4() != da.Is4() || len(id) > 1000 {
			return
		}
		src, dst := netip.AddrPortFrom(sa, sp), netip.AddrPortFrom(da, dp)
		hdr, err := appendProxyHeader(nil, src, dst, id)
		if err != nil {
			t.Fatal(err)
		}
		if n := int(hdr[14])<<8 | int(hdr[15]); n != len(hdr)-proxyV2FixedLen {
			t.Fatalf("length field %d, want %d", n, len(hdr)-proxyV2FixedLen)
		}
		got, err := parseWithGoProxyproto(t, hdr)
		if err != nil {
			t.Fatalf("go-proxyproto Read(%x) = %v", hdr, err)
		}
		var tlvs []proxyproto.TLV
		if id != "" {
			tlvs = []proxyproto.TLV{{Type: proxyTLVPeerIdentity, Value: []byte(id)}}
		}
		if diff := cmp.Diff([]any{src.String(), dst.String(), tlvs}, []any{got.Src, got.Dst, got.TLVs}); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	})
}
