package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
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
func (p *Proxy) handleSOCKS5(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(socksHandshakeTO))
	dst, rep, err := p.socksHandshake(c)
	if err != nil {
		if rep != 0 {
			writeSOCKSReply(c, rep)
		}
		p.connFailed(addrPortOf(c.RemoteAddr()), dst, "outbound", err)
		return false
	}
	if err := writeSOCKSReply(c, socksRepSuccess); err != nil {
		return false
	}
	_ = c.SetDeadline(time.Time{})
	return p.proxyOutbound(c, dst)
}

// socksHandshake reads the greeting and the CONNECT request. On failure it
// returns the reply code to send (0: none).
func (p *Proxy) socksHandshake(c net.Conn) (netip.AddrPort, byte, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return netip.AddrPort{}, 0, err
	}
	if hdr[0] != socksVersion {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: version %d", errSOCKS, hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return netip.AddrPort{}, 0, err
	}
	hasNoAuth := false
	for _, m := range methods {
		hasNoAuth = hasNoAuth || m == socksNoAuth
	}
	if !hasNoAuth {
		c.Write([]byte{socksVersion, socksNoMethods})
		return netip.AddrPort{}, 0, fmt.Errorf("%w: no-auth method not offered", errSOCKS)
	}
	if _, err := c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return netip.AddrPort{}, 0, err
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return netip.AddrPort{}, 0, err
	}
	if req[0] != socksVersion {
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: version %d", errSOCKS, req[0])
	}
	if req[1] != socksCmdConnect {
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: command %d not supported", errSOCKS, req[1])
	}
	return p.socksTarget(c, req[3])
}

// socksTarget reads the destination address of a CONNECT request.
func (p *Proxy) socksTarget(c net.Conn, atyp byte) (netip.AddrPort, byte, error) {
	var ip netip.Addr
	switch atyp {
	case socksAtypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return netip.AddrPort{}, 0, err
		}
		ip = netip.AddrFrom4(b)
	case socksAtypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return netip.AddrPort{}, 0, err
		}
		ip = netip.AddrFrom16(b).Unmap()
	case socksAtypDomain:
		var n [1]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return netip.AddrPort{}, 0, err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(c, name); err != nil {
			return netip.AddrPort{}, 0, err
		}
		var ok bool
		if ip, ok = p.resolveServiceVIP(string(name), addrPortOf(c.RemoteAddr()).Addr().Is4()); !ok {
			var port [2]byte
			io.ReadFull(c, port[:])
			return netip.AddrPort{}, socksRepHostUnr, fmt.Errorf("resolve %q: no such service", name)
		}
	default:
		return netip.AddrPort{}, socksRepNotSupp, fmt.Errorf("%w: address type %d", errSOCKS, atyp)
	}
	var port [2]byte
	if _, err := io.ReadFull(c, port[:]); err != nil {
		return netip.AddrPort{}, 0, err
	}
	return netip.AddrPortFrom(ip, binary.BigEndian.Uint16(port[:])), 0, nil
}

// resolveServiceVIP resolves a service hostname to one of its VIPs on this
// network, preferring the client's address family. gozt has no DNS proxy
// yet, so SOCKS5 domain targets resolve against mesh services only.
func (p *Proxy) resolveServiceVIP(name string, preferV4 bool) (netip.Addr, bool) {
	var found netip.Addr
	for _, svc := range p.cfg.Store.Snapshot().ServicesByHostname(name) {
		for _, vip := range svc.VIPs {
			if vip.Network != p.cfg.Network {
				continue
			}
			a := vip.Address.Unmap()
			if a.Is4() == preferV4 {
				return a, true
			}
			if !found.IsValid() {
				found = a
			}
		}
	}
	return found, found.IsValid()
}

// writeSOCKSReply sends a reply with bound address 0.0.0.0:0.
func writeSOCKSReply(c net.Conn, rep byte) error {
	_, err := c.Write([]byte{socksVersion, rep, 0, socksAtypIPv4, 0, 0, 0, 0, 0, 0})
	if err != nil {
		return errors.Join(errSOCKS, err)
	}
	return nil
}
