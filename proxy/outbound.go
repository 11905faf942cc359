package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// handleOutbound serves a connection captured on 15001 (SPEC §3.1).
func (p *Proxy) handleOutbound(c net.Conn) (net.Conn, func(relay.Result, error)) {
	return p.proxyOutbound(c, originalDst(c))
}

// originalDst is SO_ORIGINAL_DST, falling back to the socket's local address
// (SPEC §3.1 step 1).
func originalDst(c net.Conn) netip.AddrPort {
	if tc, ok := c.(*net.TCPConn); ok {
		if dst, ok, err := sockopt.OriginalDst(tc); err == nil && ok {
			return unmap(dst)
		}
	}
	return addrPortOf(c.LocalAddr())
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return unmap(ta.AddrPort())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return unmap(ap)
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// proxyOutbound routes one outbound connection to dst and opens its
// upstream leg, returning it with the finish that records the connection (a
// handler's result). It is shared by the outbound listener and SOCKS5.
func (p *Proxy) proxyOutbound(down net.Conn, dst netip.AddrPort) (net.Conn, func(relay.Result, error)) {
	up, rec := p.openOutbound(down, dst)
	if up == nil {
		// The application's connection was accepted, so its end must not
		// read like an empty answer: a reset, whether or not its first
		// bytes are still unread (TESTPLAN 34). ztunnel's close resets only
		// while some are.
		p.abortLeg(down)
		return nil, nil
	}
	// The client's first bytes, sent with the CONNECT, count as the
	// request bytes the relay copies after them.
	var early int64
	if cs, ok := up.(*hbone.ClientStream); ok {
		early = cs.EarlyBytes()
		p.live.PreCount(rec, early)
	}
	return up, func(res relay.Result, err error) { rec.Close(early+res.AToB, res.BToA, err) }
}

// openOutbound routes the connection and opens its upstream leg; nil means
// it failed and was logged.
func (p *Proxy) openOutbound(down net.Conn, dst netip.AddrPort) (net.Conn, *telemetry.Record) {
	downAddr := addrPortOf(down.RemoteAddr())
	if dst.Addr().IsLoopback() && p.illegal.contains(dst.Port()) {
		p.connFailed(downAddr, dst, "outbound", errSelfCall)
		return nil, nil
	}
	snap, src := p.awaitLocalWorkload(p.lifetime)
	if src == nil {
		p.connFailed(downAddr, dst, "outbound", errUnknownSource)
		return nil, nil
	}
	snap = p.fetchOutbound(snap, src, dst)
	r := router{snap: snap, network: p.cfg.Network}
	rt, err := r.decide(src, downAddr.Addr(), dst)
	if err == nil && rt.hostname != "" {
		rt, err = p.resolveRoute(&r, src, rt)
	}
	if err != nil {
		p.connFailed(downAddr, dst, "outbound", err)
		return nil, nil
	}
	labels := telemetry.Labels{Reporter: "source", ResponseFlags: telemetry.FlagNone, SecurityPolicy: telemetry.SecurityUnknown}
	labels.SetSource(src)
	labels.SetDestination(rt.workload)
	labels.SetService(rt.service)
	if rt.kind == routeHBONE {
		labels.SrcPrincipal = src.Identity().String()
		labels.SecurityPolicy = telemetry.SecurityMutualTLS
	}
	var up net.Conn
	if rt.inner != nil {
		// The destination is the workload behind the gateway, and its
		// principal the inner peer certificate's (SPEC §7.1), known only
		// once the inner handshake is done: the connection is recorded
		// from then on, as ztunnel builds its record.
		labels.SetDestination(rt.inner.dest)
		var peerID string
		var ic *innerConn
		ic, peerID, err = p.dialDoubleHBONE(src, labels.SrcPrincipal, downAddr, rt)
		if err == nil {
			// ztunnel takes the destination's labels from the inner 200's
			// baggage (with_derived_destination): the workload as its own
			// network describes it, which this network's xDS may not.
			setDerivedDestination(&labels, parseBaggage(ic.ResponseHeader().Values(headerBaggage)), peerID)
			ic.DropHeader() // read; a long tunnel need not keep it
			up = ic
		}
	}
	rec := p.cfg.Metrics.Open(p.accessLog, labels, false, downAddr, rt.dial, "")
	if rt.kind == routeHBONE {
		rec.SetHBONEAddr(rt.authority)
	}
	var es *earlySource
	if rt.inner == nil {
		if rt.kind == routeHBONE && !p.cfg.NoEarlyData {
			es = &earlySource{Conn: down}
		}
		up, err = p.dialOutbound(src, labels.SrcPrincipal, downAddr, rt, es)
	}
	if err != nil {
		rec.Fail(failureFlag(err), err) // proxyOutbound resets the client
		return nil, nil
	}
	if p.cfg.ListConnections {
		proto := "TCP"
		switch {
		case rt.inner != nil:
			proto = "DOUBLEHBONE" // ztunnel's OutboundProtocol, as serde names it
		case rt.kind == routeHBONE:
			proto = "HBONE"
		}
		p.live.Add(rec, telemetry.ConnAddrs{Src: downAddr, OriginalDst: dst, ActualDst: rt.dial, Protocol: proto})
		p.live.Bind(rec, down)
	}
	return up, rec
}

// dialOutbound opens the upstream leg of rt: an HBONE stream or a TCP
// connection. srcID is the source's SPIFFE id (HBONE only). An HBONE
// stream's CONNECT carries the client's first bytes, read from es while the
// response is awaited (hbone.Pool.ConnectEarly): a client that speaks first
// does not wait a tunnel crossing for the 200 before its request moves.
// ztunnel waits (src/proxy/h2/client.rs, send_request awaits the response
// before the stream is copied); its inbound holds the bytes until it has
// authorized the request and dialed the destination, as gozt's does (see
// hbone's early.go), so a denied destination still receives nothing.
func (p *Proxy) dialOutbound(src *state.Workload, srcID string, downAddr netip.AddrPort, rt route, es *earlySource) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(p.lifetime, connectTimeout)
	defer cancel()
	if rt.kind != routeHBONE {
		c, err := p.dial(ctx, p.cfg.OutboundSource, rt.dial)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", rt.dial, err)
		}
		return c, nil
	}
	cs, err := p.connectPooled(ctx, srcID, downAddr, rt, connectHeader(src, downAddr, rt), es)
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// earlySource is the downstream leg as hbone's early sender reads it: the
// connection, and, on Linux, TryRead for what it already holds
// (early_linux.go; elsewhere hbone reads it on a goroutine). What
// it took is the stream's EarlyBytes.
type earlySource struct{ net.Conn }

// poolKey is the pool key of rt's HBONE connections (SPEC §3.6).
func poolKey(srcID string, downAddr netip.AddrPort, rt route) hbone.Key {
	return hbone.Key{
		SrcIdentity:   srcID,
		DstIdentities: strings.Join(rt.sans, ","),
		Dst:           rt.dial,
		SrcIP:         downAddr.Addr(),
	}
}

// connectPooled opens rt's CONNECT stream with header h on a pooled HBONE
// connection to rt.dial (SPEC §3.6), carrying the client's first bytes from
// es if it is not nil (hbone.Pool.ConnectEarly). Nothing reads the 200's
// fields of these streams, so the stream does not keep them.
func (p *Proxy) connectPooled(ctx context.Context, srcID string, downAddr netip.AddrPort, rt route, h http.Header, es *earlySource) (*hbone.ClientStream, error) {
	key := poolKey(srcID, downAddr, rt)
	var s *hbone.ClientStream
	var err error
	if es != nil {
		s, err = p.pool.ConnectEarly(ctx, key, rt.authority, h, es)
	} else {
		s, err = p.pool.Connect(ctx, key, rt.authority, h)
	}
	if err != nil {
		return nil, fmt.Errorf("hbone connect %s via %s: %w", rt.authority, rt.dial, err)
	}
	s.DropHeader()
	return s, nil
}

// connectHeader is the header of rt's CONNECT from src for the app at
// downAddr (SPEC §2.3), with a new traceparent, without x-forwarded-network.
func connectHeader(src *state.Workload, downAddr netip.AddrPort, rt route) http.Header {
	h := make(http.Header, 4)
	if b := baggage(src); b != "" {
		h.Set(headerBaggage, b)
	}
	svcHost := ""
	if rt.service != nil {
		svcHost = rt.service.Hostname
	}
	h.Set(headerForwarded, forwarded(downAddr, svcHost))
	h.Set(headerTraceparent, traceparent())
	return h
}

// dialHBONE opens a new pooled HBONE connection for key: TCP, mTLS with the
// source identity's certificate, then HTTP/2.
func (p *Proxy) dialHBONE(ctx context.Context, key hbone.Key) (*hbone.ClientConn, error) {
	id, err := identity.Parse(key.SrcIdentity)
	if err != nil {
		return nil, err
	}
	cert, err := p.cfg.Certs.Get(ctx, id)
	if err != nil {
		return nil, withFlag(telemetry.FlagIdentity, fmt.Errorf("certificate for %s: %w", id, err))
	}
	raw, err := p.dial(ctx, p.cfg.OutboundSource, key.Dst)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return nil, withFlag(telemetry.FlagNetworkPolicy, fmt.Errorf(
			"connect %s: connection timed out, maybe a NetworkPolicy is blocking HBONE port %d: %w", key.Dst, key.Dst.Port(), err))
	}
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", key.Dst, err)
	}
	// BatchConn coalesces the TLS records of one batch of HTTP/2 frames into one
	// write (DESIGN "Making HBONE fast"); gozt bench showed ~12% less CPU per GB.
	tc := tls.Client(hbone.NewBatchConn(raw), p.cfg.TLS.ClientConfig(cert, strings.Split(key.DstIdentities, ",")))
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		p.noteHandshakeError(err, "source")
		return nil, withFlag(handshakeFlag(err), fmt.Errorf("tls handshake with %s: %w", key.Dst, err))
	}
	// The connection takes min(POOL_MAX_STREAMS_PER_CONNECTION, the peer's
	// limit) streams (SPEC §2.2), as the pool assumes.
	ccfg := p.cfg.HBONE
	ccfg.MaxConcurrentStreams = uint32(p.poolMaxStreams())
	cc, err := hbone.NewClientConn(ctx, tc, ccfg)
	if err != nil {
		tc.Close()
		return nil, withFlag(telemetry.FlagH2, fmt.Errorf("http/2 handshake with %s: %w", key.Dst, err))
	}
	if cs := tc.ConnectionState(); !p.trackOutbound(cc, cert, &cs) {
		return nil, withFlag(telemetry.FlagRevoked, fmt.Errorf("tls handshake with %s: %w", key.Dst, certs.ErrCertRevoked))
	}
	return cc, nil
}

// connFailed logs an early failure, before a connection record exists
// (SPEC §7.3: WARN "connection failed").
func (p *Proxy) connFailed(src, dst netip.AddrPort, direction string, err error) {
	p.accessLog.Warn("connection failed", "src.addr", src.String(), "dst.addr", dst.String(),
		"direction", direction, "error", err.Error())
}
