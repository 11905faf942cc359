package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/proxy/state"
	"github.com/gozt/gozt/rbac"
)

// inboundError is an HBONE request failure with the status to answer
// (SPEC §2.4): 400, 401 or 503.
type inboundError struct {
	status int
	flag   string
	err    error
}

func (e *inboundError) Error() string { return fmt.Sprintf("%d: %v", e.status, e.err) }
func (e *inboundError) Unwrap() error { return e.err }

func badRequest(err error) *inboundError {
	return &inboundError{http.StatusBadRequest, flagConnect, err}
}
func unavailable(err error) *inboundError {
	return &inboundError{http.StatusServiceUnavailable, flagConnect, err}
}

// handleInbound terminates mTLS on 15008 and serves HTTP/2 CONNECT streams.
// Each CONNECT stream is handed off on its own (serveConnect); c never is.
func (p *Proxy) handleInbound(c net.Conn) (net.Conn, func(relay.Result, error)) {
	tc := tls.Server(hbone.NewBatchConn(c), certs.ServerConfig(p.serverCert))
	ctx, cancel := context.WithTimeout(p.lifetime, handshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		p.log.Debug("inbound tls handshake failed", "src.addr", c.RemoteAddr(), "error", err)
		return nil, nil
	}
	cs := tc.ConnectionState()
	id, _ := certs.PeerIdentity(&cs) // zero when absent: no identity
	p.peers.Store(tc, &peer{id: id, principal: principal(id)})
	defer p.peers.Delete(tc)
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

// inboundRequest is a validated CONNECT: who asks, for what.
type inboundRequest struct {
	local        *state.Workload
	src          netip.AddrPort // HBONE TCP peer
	srcID        identity.Identity
	srcPrincipal string         // srcID as a SPIFFE id, built once per TLS connection
	l3dst        netip.AddrPort // where the HBONE connection landed
	authority    authority
	upstream     netip.AddrPort // local pod IP and resolved target port
	service      *state.Service
	authz        rbac.Conn       // what authorization saw, for live re-checks
	snap         *state.Snapshot // the snapshot every check used, or nil before it was taken
}

// serveConnect handles one CONNECT stream (SPEC §2.4, steps in order). It
// runs inside the handler of the stream's TLS connection (ServeConn returns
// only after its stream handlers), so it may hand the stream off.
func (p *Proxy) serveConnect(s *hbone.ServerStream) {
	up, rec, done := p.acceptConnect(s)
	if up == nil {
		s.Close()
		return
	}
	p.handOff(s, up, func(res relay.Result, err error) { rec.close(res.AToB, res.BToA, done(err)) })
}

// acceptConnect checks, authorizes and answers one CONNECT and dials its
// upstream; a nil conn means it was refused (and answered).
func (p *Proxy) acceptConnect(s *hbone.ServerStream) (net.Conn, *connRecord, func(error) error) {
	start := time.Now()
	req, ierr := p.checkConnect(s)
	snap := req.snap
	if snap == nil {
		snap = p.cfg.Store.Snapshot()
	}
	labels := trafficLabels{reporter: "destination", responseFlags: flagNone, securityPolicy: securityMutualTLS}
	if req.local != nil {
		labels.setDestination(req.local)
	}
	labels.srcPrincipal = req.srcPrincipal
	if src := snap.WorkloadByIP(p.cfg.Network, req.src.Addr()); src != nil {
		labels.setSource(src)
	}
	if req.service == nil && req.local != nil {
		req.service = guessService(snap, req.local, forwardedHost(s.Header().Get(headerForwarded)), req.upstream.Port())
	}
	labels.setService(req.service)
	var up net.Conn
	if ierr == nil {
		up, ierr = p.dialUpstream(req)
	}
	if ierr != nil {
		labels.responseFlags = ierr.flag
	}
	rec := p.cfg.Metrics.open(p.accessLog, labels, true)
	rec.start = start
	rec.srcAddr, rec.dstAddr, rec.hboneAddr = req.src, req.l3dst, s.Authority()
	if ierr != nil {
		_ = s.Respond(ierr.status, nil)
		rec.close(0, 0, ierr)
		return nil, nil, nil
	}
	p.listConn(rec, ConnJSON{Src: req.src.String(), OriginalDst: s.Authority(), ActualDst: req.upstream.String(), Protocol: "HBONE"})
	h := http.Header{}
	if b := baggage(req.local); b != "" {
		h.Set(headerBaggage, b)
	}
	if err := s.Respond(http.StatusOK, h); err != nil {
		up.Close()
		rec.close(0, 0, err)
		return nil, nil, nil
	}
	done := p.watchPolicy(connmgr.Info{WorkloadUID: req.local.UID, Conn: req.authz, Inbound: connmgr.InboundHBONE, Checked: req.snap}, rec, s, up)
	return up, rec, done
}

// checkConnect runs the checks of SPEC §2.4 steps 1–5. The request is
// returned filled as far as the checks got, for logging.
func (p *Proxy) checkConnect(s *hbone.ServerStream) (inboundRequest, *inboundError) {
	var req inboundRequest
	conn := s.Conn()
	req.src = addrPortOf(conn.RemoteAddr())
	req.l3dst = addrPortOf(conn.LocalAddr())
	if v, ok := p.peers.Load(conn); ok { // always: handleInbound stored it
		pr := v.(*peer)
		req.srcID, req.srcPrincipal = pr.id, pr.principal
	}
	if s.Method() != http.MethodConnect {
		return req, badRequest(errNotConnect)
	}
	auth, err := parseAuthority(s.Authority())
	if err != nil {
		return req, badRequest(fmt.Errorf("%w: %q", err, s.Authority()))
	}
	req.authority = auth
	snap := p.cfg.Store.Snapshot()
	req.snap = snap
	req.local = p.localWorkload(snap)
	if req.local == nil {
		return req, unavailable(errNoLocalWorkload)
	}
	port := auth.port
	if auth.host == "" {
		if auth.addr.Addr() != req.l3dst.Addr() && !p.reachesViaWaypoint(snap, req.local, auth.addr.Addr(), req.l3dst.Addr()) {
			return req, badRequest(errIPMismatch)
		}
	} else {
		svc, target := p.resolveHostname(snap, req.local, auth)
		if svc == nil {
			return req, unavailable(errNoService)
		}
		req.service = svc
		if target == 0 {
			return req, unavailable(errNoTargetPort)
		}
		port = target
	}
	if p.isIllegalPort(port) {
		return req, unavailable(errSelfCall)
	}
	if at := req.local.ApplicationTunnel; at != nil && at.Port != 0 {
		// PROXY-protocol application tunnels (SPEC §2.7) are not supported
		// yet; plain port replacement (protocol NONE) is.
		if at.Protocol != state.AppTunnelNone {
			return req, unavailable(errors.New("PROXY protocol application tunnel is not supported yet"))
		}
		port = at.Port
	}
	req.upstream = netip.AddrPortFrom(req.l3dst.Addr(), port)
	req.authz = rbac.Conn{Src: req.src, Dst: req.upstream, Identity: req.srcID}
	if err := authorize(snap, req.local, req.authz); err != nil {
		return req, &inboundError{http.StatusUnauthorized, flagDeny, err}
	}
	return req, nil
}

// authorize applies the local workload's L4 policies (SPEC §4) to c. The
// error names the deciding policy or the reason.
func authorize(snap *state.Snapshot, local *state.Workload, c rbac.Conn) error {
	d := rbac.Evaluate(snap, rbac.Target{Namespace: local.Namespace, PolicyRefs: local.AuthorizationPolicies}, c)
	if d.Allow {
		return nil
	}
	return fmt.Errorf("%w: %s", errDenied, d)
}

// reachesViaWaypoint reports whether target (the authority IP) may be served
// by this local workload although it is not the address the connection
// reached: the local workload has an application tunnel, or it is the
// waypoint of the workload or service at target (SPEC §2.4 step 4).
func (p *Proxy) reachesViaWaypoint(snap *state.Snapshot, local *state.Workload, target, l3dst netip.Addr) bool {
	if local.ApplicationTunnel != nil {
		return true
	}
	isLocal := func(gw *state.GatewayAddress) bool {
		if gw == nil {
			return false
		}
		if gw.Address != nil {
			return gw.Address.Address.Unmap() == l3dst
		}
		svc := snap.ServiceByKey(gw.Hostname.Namespace + "/" + gw.Hostname.Hostname)
		if svc == nil {
			return false
		}
		_, ok := svc.Endpoints[local.UID]
		return ok
	}
	if w := snap.WorkloadByIP(p.cfg.Network, target); w != nil {
		return isLocal(w.Waypoint)
	}
	if svc := snap.ServiceByVIP(p.cfg.Network, target, local.Namespace); svc != nil {
		return isLocal(svc.Waypoint)
	}
	return false
}

// resolveHostname finds the service a hostname authority names, preferring
// the local workload's namespace, and the target port for this workload.
func (p *Proxy) resolveHostname(snap *state.Snapshot, local *state.Workload, auth authority) (*state.Service, uint16) {
	var svc *state.Service
	for _, s := range snap.ServicesByHostname(auth.host) {
		if s.Visibility == state.Namespace && s.Namespace != local.Namespace {
			continue
		}
		if svc == nil || s.Namespace == local.Namespace {
			svc = s
		}
	}
	if svc == nil {
		return nil, 0
	}
	if ep, ok := svc.Endpoints[local.UID]; ok {
		if t := ep.Ports[auth.port]; t != 0 {
			return svc, t
		}
	}
	return svc, svc.Ports[auth.port]
}

// dialUpstream connects to the local workload with the HBONE peer's IP as
// source (SPEC §2.4 step 7, §2.5).
func (p *Proxy) dialUpstream(req inboundRequest) (net.Conn, *inboundError) {
	c, err := p.dialSpoofed(req.src.Addr(), req.upstream)
	if err != nil {
		return nil, unavailable(err)
	}
	return c, nil
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
	ctx, cancel := context.WithTimeout(p.lifetime, connectTimeout)
	defer cancel()
	c, err := p.dial(ctx, bind, dst.String())
	if err != nil && bind.IsValid() && p.cfg.Spoof == SpoofAuto && isBindError(err) {
		// Preserving the source failed (no IP_TRANSPARENT privilege):
		// connect without it, as ztunnel does.
		p.log.Debug("source-preserving dial failed; dialing without", "src", bind, "dst", dst, "error", err)
		c, err = p.dial(ctx, netip.Addr{}, dst.String())
	}
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", dst, err)
	}
	return c, nil
}

// isLocal reports whether ip is an address of the proxy's network namespace.
func (p *Proxy) isLocal(ip netip.Addr) bool {
	if p.cfg.InNetns == nil {
		return sockopt.IsLocal(ip)
	}
	local := false
	_ = p.cfg.InNetns(func() error {
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

// guessService names the service an inbound connection was for, for metrics
// and logs only (SPEC §7.1): the Forwarded host= service if the workload
// belongs to it, else the first of the workload's services whose target port
// is the destination port.
func guessService(snap *state.Snapshot, local *state.Workload, host string, port uint16) *state.Service {
	if host != "" {
		if svc := snap.ServiceByKey(local.Namespace + "/" + host); svc != nil {
			if _, ok := local.Services[svc.Key()]; ok {
				return svc
			}
		}
		for key := range local.Services {
			if svc := snap.ServiceByKey(key); svc != nil && svc.Hostname == host {
				return svc
			}
		}
	}
	var best *state.Service
	for key, ports := range local.Services {
		svc := snap.ServiceByKey(key)
		if svc == nil {
			continue
		}
		for sp, tp := range ports {
			if tp == port || (tp == 0 && svc.Ports[sp] == port) {
				if best == nil || svc.Key() < best.Key() {
					best = svc
				}
			}
		}
	}
	return best
}
