package proxy

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// This file writes the PROXY protocol version 2 header that an inbound
// connection to a workload with a PROXY application tunnel starts with
// (SPEC §2.7). Section numbers below are those of HAProxy's
// doc/proxy-protocol.txt, which defines the format.

// proxyV2Signature is the 12-byte signature every version 2 header starts
// with (§2.2).
const proxyV2Signature = "\r\n\r\n\x00\r\nQUIT\n"

// The fixed part of a version 2 header (§2.2): the signature, then one byte
// each for version/command and family/protocol, then the big-endian length
// of the rest (addresses and TLVs).
const (
	proxyV2FixedLen = len(proxyV2Signature) + 4

	proxyV2Proxy = 0x21 // version 2 (high nibble), command PROXY (low nibble)

	proxyFamUnspec = 0x01 // AF_UNSPEC, STREAM: no address block
	proxyFamTCP4   = 0x11 // AF_INET, STREAM
	proxyFamTCP6   = 0x21 // AF_INET6, STREAM

	proxyAddrLen4 = 2*4 + 2*2  // source, destination, source port, destination port
	proxyAddrLen6 = 2*16 + 2*2 // likewise with 16-byte addresses

	proxyTLVHeaderLen = 3 // type, big-endian 16-bit length (§2.2.7)
)

// proxyTLVPeerIdentity is the TLV type that carries the HBONE peer's SPIFFE
// URI: ztunnel's PROXY_PROTOCOL_AUTHORITY_TLV, a type §2.2.7 does not assign,
// which the receiving waypoint reads as the peer's principal. ztunnel never
// writes the 0xD1 (service hostname) that the workload API's comment
// mentions, and neither does gozt.
const proxyTLVPeerIdentity = 0xD0

// errProxyHeaderTooLong is a header whose length does not fit its 16-bit
// length field.
var errProxyHeaderTooLong = errors.New("proxy protocol header longer than 65535 bytes")

// appendProxyHeader appends to b a PROXY protocol v2 header with command
// PROXY over TCP from src to dst, and, when peerID is not empty, a TLV 0xD0
// carrying it (the peer's SPIFFE URI, SPEC §2.7).
//
// The address family follows src and dst, which must be valid: both IPv4
// is AF_INET, both IPv6 AF_INET6 (an IPv4-mapped address counts as IPv6, as
// netip has it; callers pass unmapped peer and authority addresses). When
// they differ, the header says AF_UNSPEC and carries no address block, only
// the TLV: that is what ztunnel writes (its ppp builder turns a mixed
// address pair into "unspecified"), and §2.2 lets the receiver accept such a
// header, using the real connection's endpoints, or refuse it.
func appendProxyHeader(b []byte, src, dst netip.AddrPort, peerID string) ([]byte, error) {
	fam, addrLen := byte(proxyFamUnspec), 0
	switch s, d := src.Addr(), dst.Addr(); {
	case s.Is4() && d.Is4():
		fam, addrLen = proxyFamTCP4, proxyAddrLen4
	case s.Is6() && d.Is6():
		fam, addrLen = proxyFamTCP6, proxyAddrLen6
	}
	n := addrLen
	if peerID != "" {
		n += proxyTLVHeaderLen + len(peerID)
	}
	if n > 0xFFFF {
		return b, errProxyHeaderTooLong
	}
	b = append(b, proxyV2Signature...)
	b = append(b, proxyV2Proxy, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	if addrLen > 0 {
		// §2.2: both addresses, then both ports, in network byte order.
		b = append(b, src.Addr().AsSlice()...)
		b = append(b, dst.Addr().AsSlice()...)
		b = binary.BigEndian.AppendUint16(b, src.Port())
		b = binary.BigEndian.AppendUint16(b, dst.Port())
	}
	if peerID != "" {
		b = append(b, proxyTLVPeerIdentity)
		b = binary.BigEndian.AppendUint16(b, uint16(len(peerID)))
		b = append(b, peerID...)
	}
	return b, nil
}
