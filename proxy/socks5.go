package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// SOCKS5 (RFC 1928), the minimal subset ztunnel serves on 15080 (SPEC §10.2).
const (
	socksVersion     = 5
	socksNoAuth      = 0
	socksNoMethods   = 0xff
	socksCmdConnect  = 1
	socksAtypIPv4    = 1
	socksAtypDomain  = 3
	socksAtypIPv6    = 4
	socksRepSuccess  = 0
	socksRepFailure  = 1
	socksRepHostUnr  = 4
	socksRepNotSupp  = 7
	socksHandshakeTO = 10 * time.Second
)

// handleSOCKS5 negotiates SOCKS5, answers success before connecting (as
// ztunnel does), then runs the normal outbound logic.
func (p *Proxy) handleSOCKS5(c net.Conn) (net.Conn, func(relay.Result, error)) {
	_ = c.SetDeadline(time.Now().Add(socksHandshakeTO))
	dst, rep, err := p.socksHandshake(c)
	if err != nil {
		if rep != 0 {
			writeSOCKSReply(c, rep)
		}
		p.connFailed(addrPortOf(c.RemoteAddr()), dst, "outbound", err)
		return nil, nil
	}
	if err := writeSOCKSReply(c, socksRepSuccess); err != nil {
		return nil, nil
	}
	_ = c.SetDeadline(time.Time{})
	return p.proxyOutbound(c, dst)
}

// socksBuf holds the longest SOCKS5 message: a request for a 255-byte domain.
type socksBuf [4 + 1 + 255 + 2]byte

// socksBufPool holds the handshake buffers; nothing read into one outlives
// the handshake (the address is copied out).
var socksBufPool = sync.Pool{New: func() any { return new(socksBuf) }}

// socksHandshake reads the greeting and the CONNECT request. On failure it
// returns the reply code to send (0: none).
//
// It reads each message in as few reads as the protocol allows without
// reading past it (the client's first bytes of payload must stay in the
// socket for the relay): the greeting's first three bytes at once (a
// greeting offers at least one method), the request's first five (through
// the address's first byte, which is a domain's length), then the rest of
// each. That is three reads for the usual client instead of six.
func (p *Proxy) socksHandshake(c net.Conn) (netip.AddrPort, byte, error) {
	buf := socksBufPool.Get().(*socksBuf) // reads through an interface would move a local one to the heap
	defer socksBufPool.Put(buf)
	if _, err := io.ReadFull(c, buf[:3]); err != nil {
		return netip.AddrPort{}, 0, err
	}
	if buf[0] != socksVersion {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: version %d", errSOCKS, buf[0])
	}
	n := int(buf[1]) // RFC 1928 requires at least one; zero is refused below
	if n > 1 {
		if _, err := io.ReadFull(c, buf[3:2+n]); err != nil {
			return netip.AddrPort{}, 0, err
		}
	}
	hasNoAuth := false
	for _, m := range buf[2 : 2+n] {
		hasNoAuth = hasNoAuth || m == socksNoAuth
	}
	if !hasNoAuth {
		c.Write([]byte{socksVersion, socksNoMethods})
		return netip.AddrPort{}, 0, fmt.Errorf("%w: no-auth method not offered", errSOCKS)
	}
	if _, err := c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return netip.AddrPort{}, 0, err
	}
	req := buf[:5]
	if _, err := io.ReadFull(c, req); err != nil {
		return netip.AddrPort{}, 0, err
	}
	if req[0] != socksVersion {
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: version %d", errSOCKS, req[0])
	}
	if req[1] != socksCmdConnect {
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: command %d not supported", errSOCKS, req[1])
	}
	var addrLen int
	switch req[3] {
	case socksAtypIPv4:
		addrLen = 4
	case socksAtypIPv6:
		addrLen = 16
	case socksAtypDomain:
		addrLen = 1 + int(req[4])
	default:
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: address type %d", errSOCKS, req[3])
	}
	// The rest: the address after its first byte, then the port.
	rest := buf[5 : 4+addrLen+2]
	if _, err := io.ReadFull(c, rest); err != nil {
		return netip.AddrPort{}, 0, err
	}
	addr, port := buf[4:4+addrLen], binary.BigEndian.Uint16(buf[4+addrLen:])
	var ip netip.Addr
	switch req[3] {
	case socksAtypIPv4:
		ip = netip.AddrFrom4([4]byte(addr))
	case socksAtypIPv6:
		ip = netip.AddrFrom16([16]byte(addr)).Unmap()
	default:
		name := string(addr[1:])
		if p.dns == nil {
			return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: domain target %q needs the DNS proxy (DNS_CAPTURE)", errSOCKS, name)
		}
		ctx, cancel := context.WithTimeout(p.lifetime, socksHandshakeTO)
		defer cancel()
		var err error
		if ip, err = p.dns.LookupIP(ctx, name, addrPortOf(c.RemoteAddr()).Addr().Is6()); err != nil {
			return netip.AddrPort{}, socksRepHostUnr, fmt.Errorf("resolve %q: %w", name, err)
		}
	}
	return netip.AddrPortFrom(ip, port), 0, nil
}

// writeSOCKSReply sends a reply with bound address 0.0.0.0:0.
func writeSOCKSReply(c net.Conn, rep byte) error {
	_, err := c.Write([]byte{socksVersion, rep, 0, socksAtypIPv4, 0, 0, 0, 0, 0, 0})
	if err != nil {
		return errors.Join(errSOCKS, err)
	}
	return nil
}
