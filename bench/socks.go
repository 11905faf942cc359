package bench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
)

// SOCKS5 (RFC 1928), the CONNECT-only, no-authentication subset that gozt
// serves on 15080. Both ends live here: the client the harness dials
// through, and the server of the x/net outbound proxy, so that gozt and the
// x/net pair are reached the same way.

var errSOCKS = errors.New("socks5")

// socksRequest is the client's greeting and CONNECT request for dst, sent
// in one write: the server reads them in turn, so no round trip is spent
// waiting for the method choice.
func socksRequest(dst netip.AddrPort) []byte {
	b := []byte{5, 1, 0, 5, 1, 0, 1}
	a := dst.Addr().As4()
	b = append(b, a[:]...)
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

// socksHandshake sends the greeting, the CONNECT request and first (the
// first application bytes) in one write on c, then reads the method choice
// and the reply.
func socksHandshake(c net.Conn, dst netip.AddrPort, first []byte) error {
	if _, err := c.Write(append(socksRequest(dst), first...)); err != nil {
		return err
	}
	var r [12]byte // method choice (2) + reply with an IPv4 bound address (10)
	if _, err := io.ReadFull(c, r[:]); err != nil {
		return fmt.Errorf("%w: reply: %v", errSOCKS, err)
	}
	if r[0] != 5 || r[1] != 0 || r[2] != 5 || r[3] != 0 || r[5] != 1 {
		return fmt.Errorf("%w: refused: % x", errSOCKS, r)
	}
	return nil
}

// socksAccept reads a client's greeting and CONNECT request from c and
// answers success at once (as gozt and ztunnel do, before connecting
// upstream). It returns the destination.
func socksAccept(c net.Conn) (netip.AddrPort, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return netip.AddrPort{}, err
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return netip.AddrPort{}, err
	}
	if hdr[0] != 5 {
		return netip.AddrPort{}, fmt.Errorf("%w: version %d", errSOCKS, hdr[0])
	}
	if _, err := c.Write([]byte{5, 0}); err != nil {
		return netip.AddrPort{}, err
	}
	var req [10]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return netip.AddrPort{}, err
	}
	if req[0] != 5 || req[1] != 1 || req[3] != 1 {
		c.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0})
		return netip.AddrPort{}, fmt.Errorf("%w: unsupported request % x", errSOCKS, req[:4])
	}
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(req[4:8])), binary.BigEndian.Uint16(req[8:]))
	_, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	return dst, err
}

// dialFunc opens a connection to the test server and sends first, the
// mode byte and any payload that goes with it.
type dialFunc func(ctx context.Context, first []byte) (net.Conn, error)

// tcpDialer dials from src (if valid).
func tcpDialer(src netip.Addr) *net.Dialer {
	d := &net.Dialer{}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		d.Control = bindNoPort
	}
	return d
}

// directDial connects straight to dst.
func directDial(src netip.Addr, dst netip.AddrPort) dialFunc {
	d := tcpDialer(src)
	return func(ctx context.Context, first []byte) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return nil, err
		}
		if _, err := c.Write(first); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// socksDial connects to dst through the SOCKS5 proxy at proxy.
func socksDial(src netip.Addr, proxy, dst netip.AddrPort) dialFunc {
	d := tcpDialer(src)
	return func(ctx context.Context, first []byte) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", proxy.String())
		if err != nil {
			return nil, err
		}
		if err := socksHandshake(c, dst, first); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// tlsDial connects straight to dst over TLS with cfg.
func tlsDial(src netip.Addr, dst netip.AddrPort, cfg *tls.Config) dialFunc {
	d := tcpDialer(src)
	return func(ctx context.Context, first []byte) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return nil, err
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		if _, err := tc.Write(first); err != nil {
			c.Close()
			return nil, err
		}
		return tc, nil
	}
}
