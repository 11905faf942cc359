package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// This file carries a connection to another network through its east-west
// gateway (SPEC §2.6, double HBONE): an outer CONNECT on a pooled HBONE
// connection to the gateway, then, over that stream, a TLS session and an
// HTTP/2 connection of the connection's own with one CONNECT to the
// destination. The gateway forwards the inner bytes without reading them;
// the destination's proxy answers the inner CONNECT as any other.

// dialDoubleHBONE opens rt's outer stream to the gateway and its inner
// tunnel to the destination, and returns the inner stream with the SPIFFE
// id the destination's certificate carries.
func (p *Proxy) dialDoubleHBONE(src *state.Workload, srcID string, downAddr netip.AddrPort, rt route) (*innerConn, string, error) {
	ctx, cancel := context.WithTimeout(p.lifetime, connectTimeout)
	defer cancel()
	// Both CONNECTs are one connection's: one traceparent, as ztunnel
	// builds both requests from the connection's.
	h := connectHeader(src, downAddr, rt)
	outer, err := p.connectPooled(ctx, srcID, downAddr, rt, h, nil)
	if err != nil {
		return nil, "", err
	}
	inner := h.Clone()
	inner.Set(headerForwardedNetwork, p.cfg.Network)
	c, peerID, err := p.connectInner(ctx, srcID, rt, outer, inner)
	if err != nil {
		outer.Close()
		return nil, "", fmt.Errorf("inner hbone connect %s via gateway %s: %w", rt.authority, rt.dial, err)
	}
	return c, peerID, nil
}

// connectInner runs the inner tunnel over outer: mTLS with the source's
// certificate, expecting only rt.inner.sans, then HTTP/2 and one CONNECT to
// rt.authority with header h. Nothing of it is pooled, so that
// each connection may reach a different workload behind the gateway (as
// ztunnel's proxy_to_double_hbone explains). On failure the caller closes
// outer.
func (p *Proxy) connectInner(ctx context.Context, srcID string, rt route, outer net.Conn, h http.Header) (*innerConn, string, error) {
	id, err := identity.Parse(srcID)
	if err != nil {
		return nil, "", err
	}
	cert, err := p.cfg.Certs.Get(ctx, id)
	if err != nil {
		return nil, "", withFlag(telemetry.FlagIdentity, fmt.Errorf("certificate for %s: %w", id, err))
	}
	tc := tls.Client(outer, p.cfg.TLS.ClientConfig(cert, rt.inner.sans))
	if err := tc.HandshakeContext(ctx); err != nil {
		p.noteHandshakeError(err, "source")
		return nil, "", withFlag(handshakeFlag(err), fmt.Errorf("tls handshake: %w", err))
	}
	cs := tc.ConnectionState()
	peer, _ := certs.PeerIdentity(&cs) // the handshake checked it is one of rt.inner.sans
	ccfg := p.cfg.HBONE
	ccfg.MaxConcurrentStreams = 1
	cc, err := hbone.NewClientConn(ctx, tc, ccfg) // closes tc, and so outer, on failure
	if err != nil {
		return nil, "", withFlag(telemetry.FlagH2, fmt.Errorf("http/2 handshake: %w", err))
	}
	if !p.trackOutbound(cc, cert, &cs) {
		return nil, "", withFlag(telemetry.FlagRevoked, fmt.Errorf("tls handshake: %w", certs.ErrCertRevoked))
	}
	s, err := cc.Connect(ctx, rt.authority, h)
	if err != nil {
		cc.Close()
		return nil, "", err
	}
	return &innerConn{ClientStream: s, cc: cc, outer: outer}, telemetry.Principal(peer), nil
}

// innerConn is the inner stream of a double HBONE connection. It owns the
// inner HTTP/2 connection and the outer stream under it: closing it closes
// all three. Reads, writes, half-close and reset notices are the inner
// stream's.
type innerConn struct {
	*hbone.ClientStream
	cc    *hbone.ClientConn
	outer net.Conn
}

// Close closes the inner stream, its connection and the outer stream.
func (c *innerConn) Close() error {
	err := c.ClientStream.Close()
	c.cc.Close()
	c.outer.Close()
	return err
}

// Abort resets the inner stream with CONNECT_ERROR, then closes the rest.
func (c *innerConn) Abort() error {
	err := c.ClientStream.Abort()
	c.cc.Close()
	c.outer.Close()
	return err
}
