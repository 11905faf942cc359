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
	"syscall"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// handleInbound terminates mTLS on 15008 and serves HTTP/2 CONNECT streams.
// Each CONNECT stream is handed off on its own (serveConnect); c never is.
func (p *Proxy) handleInbound(c net.Conn) (net.Conn, func(relay.Result, error)) {
	tc := tls.Server(hbone.NewBatchConn(c), p.cfg.TLS.ServerConfig(p.serverCert))
	ctx, cancel := context.WithTimeout(p.lifetime, handshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		p.log.Debug("inbound tls handshake failed", "src.addr", c.RemoteAddr(), "error", err)
		p.noteHandshakeError(err, "destination")
		return nil, nil
	}
	cs := tc.ConnectionState()
	id, _ := certs.PeerIdentity(&cs) // zero when absent: no identity
	p.peers.Store(tc, &peer{id: id, principal: telemetry.Principal(id)})
	defer p.peers.Delete(tc)
	if !p.trackInbound(tc, &cs) {
		return nil, nil
	}
	defer p.untrackTunnel(tc)
	if err := p.hbone.ServeConn(p.lifetime, tc); err != nil {
		p.log.Debug("inbound hbone connection ended", "src.addr", c.RemoteAddr(), "error", err)
	}
	return nil, nil
}

// peer is what an inbound HBONE connection's client certificate says, read
// once at the handshake rather than for every CONNECT on the connection.
type peer struct {
	id        identity.Identity
	principal string // id.String(), for the traffic labels
}

// serverCert returns the certificate of the workload this proxy serves
// (SPEC §6.4).
func (p *Proxy) serverCert(ctx context.Context) (*certs.Cert, error) {
	_, w := p.awaitLocalWorkload(ctx)
	if w == nil {
		return nil, errNoLocalWorkload
	}
	return p.cfg.Certs.Get(ctx, w.Identity())
}

// inboundRequest is a decided CONNECT: who asks, for what.
type inboundRequest struct {
	connectDecision
	src          netip.AddrPort // HBONE TCP peer
	srcID        identity.Identity
	srcPrincipal string          // srcID as a SPIFFE id, built once per TLS connection
	l3dst        netip.AddrPort  // where the HBONE connection landed
	snap         *state.Snapshot // the snapshot the decision used
	header       http.Header     // the request's fields (ServerStream.Header builds a map per call)
	viaGateway   bool            // x-forwarded-network names another network (fromGateway)
	forwardedHdr []string        // the request's Forwarded field values
}

// serveConnect handles one CONNECT stream (SPEC §2.4, steps in order). It
// runs inside the handler of the stream's TLS connection (ServeConn returns
// only after its stream handlers), so it may hand the stream off.
func (p *Proxy) serveConnect(s *hbone.ServerStream) {
	if p.cfg.Admission.MemoryPressure() {
		// A new stream on a connection already open: refused like a new
		// TCP connection (admit). Counted first, so that whoever
		// sees the 503 finds it counted.
		p.shedForMemory("inbound")
		_ = s.Respond(http.StatusServiceUnavailable, nil)
		s.Close()
		return
	}
	up, rec, done := p.acceptContained(s)
	if up == nil {
		s.Close()
		return
	}
	p.live.Bind(rec, s) // the live view counts the stream's bytes, when the list is kept
	s.DropHeader()      // read by acceptConnect; a long tunnel need not keep it
	p.handOff(s, "inbound", up, func(res relay.Result, err error) { rec.Close(res.AToB, res.BToA, done(err)) })
}

// acceptContained is acceptConnect with a panic contained and counted
// like a listener handler's: it returns no upstream, so the stream alone is
// closed (TESTPLAN F26).
func (p *Proxy) acceptContained(s *hbone.ServerStream) (up net.Conn, rec *telemetry.Record, done func(error) error) {
	defer p.containPanic(s.Conn(), "inbound")
	if testHookHandler != nil {
		testHookHandler("inbound", s.Conn())
	}
	return p.acceptConnect(s)
}

// acceptConnect checks, authorizes and answers one CONNECT and dials its
// upstream; a nil conn means it was refused (and answered).
func (p *Proxy) acceptConnect(s *hbone.ServerStream) (net.Conn, *telemetry.Record, func(error) error) {
	start := time.Now()
	req, ierr := p.checkConnect(s)
	if req.decision.Reason != 0 {
		p.logAuthz(req.decision, req.authz)
	}
	snap := req.snap
	labels := telemetry.Labels{Reporter: "destination", ResponseFlags: telemetry.FlagNone, SecurityPolicy: telemetry.SecurityMutualTLS}
	if req.local != nil {
		labels.SetDestination(req.local)
	}
	// The request's baggage describes the source when it cannot be looked
	// up (behind a gateway, or unknown here).
	labels.SrcPrincipal = req.srcPrincipal
	var src *state.Workload
	if !req.viaGateway {
		src = snap.WorkloadByIP(p.cfg.Network, req.src.Addr())
	}
	if src != nil {
		labels.SetSource(src)
	} else if !p.cfg.NoResponseBaggage {
		setDerivedSource(&labels, parseBaggage(req.header.Values(headerBaggage)), req.srcPrincipal)
	}
	if req.service == nil && req.local != nil {
		var first string
		if len(req.forwardedHdr) > 0 {
			first = req.forwardedHdr[0]
		}
		req.service = guessService(snap, req.local, forwardedHost(first), req.upstream.Port())
	}
	labels.SetService(req.service)
	var up net.Conn
	if ierr == nil {
		up, ierr = p.dialUpstream(req)
	}
	accessLog := p.accessLog
	if req.forwarded.IsValid() {
		// Only gozt logs it (SPEC §2.5): src.addr stays the peer.
		accessLog = accessLog.With("src.forwarded", req.forwarded.String())
		p.cfg.Metrics.ForwardedSource(req.srcPrincipal).Inc()
	}
	rec := p.cfg.Metrics.Open(accessLog, labels, true, req.src, req.l3dst, s.Authority())
	rec.SetStart(start)
	if ierr != nil {
		// Opened with "-", closed with the failure's flag, as ztunnel
		// records it (the flag is known only at the end).
		_ = s.Respond(ierr.status, nil)
		rec.Fail(ierr.flag, ierr)
		return nil, nil, nil
	}
	if p.cfg.ListConnections {
		p.live.Add(rec, telemetry.ConnAddrs{Src: req.src, Authority: s.Authority(), ActualDst: req.upstream, Protocol: "HBONE"})
	}
	h := http.Header{}
	if b := baggage(req.local); b != "" && !p.cfg.NoResponseBaggage {
		h.Set(headerBaggage, b)
	}
	if err := s.Respond(http.StatusOK, h); err != nil {
		up.Close()
		rec.Close(0, 0, err)
		return nil, nil, nil
	}
	if req.proxyDst.IsValid() {
		// Before any byte of the stream: nothing reads s until handOff.
		if err := writeProxyHeader(up, req); err != nil {
			up.Close()
			rec.Close(0, 0, err)
			return nil, nil, nil
		}
	}
	done := p.watchPolicy(connmgr.Info{WorkloadUID: req.local.UID, Conn: req.authz, Inbound: connmgr.InboundHBONE, Checked: req.snap}, rec, s, up)
	return up, rec, done
}

// fromGateway reports whether a CONNECT with x-forwarded-network values
// came through an east-west gateway from another network than local (SPEC
// §2.4, ztunnel's from_gateway: the first value differs, ignoring case): its
// peer address is then the gateway's, and the source workload is not looked
// up by it.
func fromGateway(values []string, local string) bool {
	return len(values) > 0 && !strings.EqualFold(values[0], local)
}

// checkConnect decides one CONNECT (SPEC §2.4 steps 1–6, decideConnect)
// against the current snapshot. The request is returned filled as far as the
// checks got, for logging.
func (p *Proxy) checkConnect(s *hbone.ServerStream) (inboundRequest, *inboundError) {
	conn := s.Conn()
	req := inboundRequest{src: addrPortOf(conn.RemoteAddr()), l3dst: addrPortOf(conn.LocalAddr()), header: s.Header()}
	req.viaGateway = fromGateway(req.header.Values(headerForwardedNetwork), p.cfg.Network)
	// The fetching happens here, so that the decision stays pure.
	req.snap = p.fetchInbound(p.cfg.Store.Snapshot(), req.src, req.l3dst, s.Method(), s.Authority(), req.viaGateway)
	if v, ok := p.peers.Load(conn); ok { // always: handleInbound stored it
		pr := v.(*peer)
		req.srcID, req.srcPrincipal = pr.id, pr.principal
	}
	req.forwardedHdr = req.header.Values(headerForwarded)
	var fwd netip.Addr
	if !p.cfg.IgnoreForwarded {
		fwd = forwardedFor(req.forwardedHdr)
	}
	var ierr *inboundError
	req.connectDecision, ierr = decideConnect(&connectQuery{
		snap: req.snap, network: p.cfg.Network, local: p.localWorkload(req.snap), illegal: p.illegal,
		method: s.Method(), authority: s.Authority(), l3dst: req.l3dst, src: req.src, srcID: req.srcID,
		forwardedFor: fwd,
	})
	p.noteInboundDenial(&req, ierr) // the live view's recent denials
	return req, ierr
}

// dialUpstream connects to the local workload with the HBONE peer's IP as
// source, or the client IP the local workload's waypoint forwarded for
// (SPEC §2.4 step 7, §2.5); a PROXY application tunnel, over loopback
// unless Config.AppTunnelToPodIP (SPEC §2.7).
func (p *Proxy) dialUpstream(req inboundRequest) (net.Conn, *inboundError) {
	if req.proxyDst.IsValid() && !p.cfg.AppTunnelToPodIP {
		c, err := p.dialLoopback(req.upstream)
		if err != nil {
			return nil, unavailable(err)
		}
		return c, nil
	}
	src := req.src.Addr()
	if fwd := req.forwarded; fwd.IsValid() && p.canBind(fwd) {
		src = fwd
	}
	c, err := p.dialSpoofed(src, req.upstream)
	if err != nil {
		return nil, unavailable(err)
	}
	return c, nil
}

// dialLoopback connects to dst's port on the loopback address of dst's
// family (127.0.0.1 or ::1), bound to that address as source, whatever the
// spoofing mode: an application tunnel listens on loopback so that only the
// proxy reaches it, and a loopback destination needs a loopback source or
// reverse-path filtering, iptables and routing break the connection, as
// ztunnel notes. The real source travels in the PROXY header.
func (p *Proxy) dialLoopback(dst netip.AddrPort) (net.Conn, error) {
	lo := netip.IPv6Loopback()
	if dst.Addr().Is4() {
		lo = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	to := netip.AddrPortFrom(lo, dst.Port())
	c, err := p.dial(p.lifetime, lo, to) // p.dial bounds the connect (connectTimeout)
	if err != nil {
		return nil, fmt.Errorf("connect %s (application tunnel): %w", to, err)
	}
	return c, nil
}

// writeProxyHeader starts the upstream connection of a PROXY application
// tunnel with the header (SPEC §2.7): from the HBONE peer, to the decided
// destination, with the peer's SPIFFE URI when it had an identity.
func writeProxyHeader(up net.Conn, req inboundRequest) error {
	hdr, err := appendProxyHeader(make([]byte, 0, 128), req.src, req.proxyDst, req.srcPrincipal)
	if err != nil {
		return err
	}
	if _, err := up.Write(hdr); err != nil {
		return fmt.Errorf("write proxy protocol header: %w", err)
	}
	return nil
}

// dialSpoofed connects to dst with src as the source IP when the spoofing
// mode allows it.
func (p *Proxy) dialSpoofed(src netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	bind := src
	switch {
	case p.cfg.Spoof == SpoofOff || src == dst.Addr():
		bind = netip.Addr{}
	case p.cfg.Spoof == SpoofAuto && !p.transparent && !p.isLocal(src):
		// ztunnel spoofs only when IP_TRANSPARENT took effect on the
		// listener; a local source needs no privilege.
		bind = netip.Addr{}
	}
	// p.dial bounds each connect (connectTimeout); a context of its own
	// here would cost every dial a timer that only a waiting one needs.
	c, err := p.dial(p.lifetime, bind, dst)
	if err != nil && bind.IsValid() && p.cfg.Spoof == SpoofAuto && isBindError(err) {
		// Preserving the source failed (no IP_TRANSPARENT privilege):
		// connect without it, as ztunnel does. The bind failed at once.
		p.log.Debug("source-preserving dial failed; dialing without", "src", bind, "dst", dst, "error", err)
		c, err = p.dial(p.lifetime, netip.Addr{}, dst)
	}
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", dst, err)
	}
	return c, nil
}

// canBind reports whether dialSpoofed would bind ip rather than no source
// at all. Where it would not (spoofing on auto, the listener not
// transparent, ip not local), the peer's IP, often local, is the better
// fallback.
func (p *Proxy) canBind(ip netip.Addr) bool {
	return p.cfg.Spoof != SpoofAuto || p.transparent || p.isLocal(ip)
}

// isLocal reports whether ip is an address of the proxy's network namespace.
func (p *Proxy) isLocal(ip netip.Addr) bool {
	local := false
	_ = p.inNetns(func() error {
		local = sockopt.IsLocal(ip)
		return nil
	})
	return local
}

// isBindError reports whether err came from binding the source address
// rather than from the destination.
func isBindError(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES)
}
