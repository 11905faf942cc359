package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// This file holds the pure inbound HBONE decision (SPEC §2.4 steps 1–6): no
// I/O, so it is tested without sockets, as route.go is for outbound.

// inboundError is an HBONE request failure with the status to answer
// (SPEC §2.4): 400, 401 or 503, and the response flag to record.
type inboundError struct {
	status int
	flag   string
	err    error
}

func (e *inboundError) Error() string { return fmt.Sprintf("%d: %v", e.status, e.err) }
func (e *inboundError) Unwrap() error { return e.err }

func badRequest(err error) *inboundError {
	return &inboundError{http.StatusBadRequest, telemetry.FlagConnect, err}
}
func unavailable(err error) *inboundError {
	return &inboundError{http.StatusServiceUnavailable, telemetry.FlagConnect, err}
}

// illegalPorts are the ports no connection may target: the proxy's own
// (SPEC §1.2), its DNS proxy's included. A zero entry is unused.
type illegalPorts [5]uint16

// contains reports whether port is one of the illegal ports.
func (ip illegalPorts) contains(port uint16) bool {
	for _, p := range ip {
		if p != 0 && p == port {
			return true
		}
	}
	return false
}

// connectQuery is one CONNECT request and everything its decision reads.
type connectQuery struct {
	snap    *state.Snapshot
	network string          // this node's network (NETWORK)
	local   *state.Workload // the workload this proxy serves, or nil
	illegal illegalPorts

	method    string
	authority string            // the raw :authority
	l3dst     netip.AddrPort    // where the HBONE connection landed
	src       netip.AddrPort    // the HBONE connection's TCP peer
	srcID     identity.Identity // the peer certificate's identity, or zero
	// forwardedFor is the request's Forwarded for= IP (forwardedFor), or
	// zero when there is none or the proxy trusts none (Config.IgnoreForwarded).
	forwardedFor netip.Addr
}

// connectDecision is where an accepted CONNECT goes. A refused one is
// filled as far as the checks got, for logs and metrics.
type connectDecision struct {
	authority authority
	local     *state.Workload // the query's, once steps 1–2 passed; else nil
	service   *state.Service  // the service a hostname authority names, or nil
	upstream  netip.AddrPort  // local pod IP and resolved target port
	authz     rbac.Conn       // what authorization saw, for live re-checks
	decision  rbac.Decision   // authorization's verdict on authz; zero if it did not run
	// forwarded is the client IP the local workload's waypoint forwarded
	// for, which the upstream dial uses as source instead of the peer's
	// (SPEC §2.5); zero when the header is absent or not trusted.
	forwarded netip.Addr
	// proxyDst is the destination the PROXY header names when the local
	// workload's application tunnel speaks PROXY (SPEC §2.7); zero when it
	// has no such tunnel.
	proxyDst netip.AddrPort
}

// decideConnect runs SPEC §2.4 steps 1–6, in order, on q.
func decideConnect(q *connectQuery) (d connectDecision, _ *inboundError) {
	if q.method != http.MethodConnect { // step 1
		return d, badRequest(errNotConnect)
	}
	auth, err := parseAuthority(q.authority) // step 2
	if err != nil {
		return d, badRequest(fmt.Errorf("%w: %q", err, q.authority))
	}
	d.authority = auth
	if q.local == nil { // step 3
		return d, unavailable(errNoLocalWorkload)
	}
	d.local = q.local
	port, ierr := q.targetPort(&d) // steps 4 and 5
	if ierr != nil {
		return d, ierr
	}
	if q.illegal.contains(port) {
		return d, unavailable(errSelfCall)
	}
	if at := q.local.ApplicationTunnel; at != nil { // SPEC §2.7
		if at.Port != 0 {
			port = at.Port
		}
		if at.Protocol == state.AppTunnelProxy {
			if d.proxyDst, ierr = q.proxyDestination(&d); ierr != nil {
				return d, ierr
			}
		}
	}
	d.upstream = netip.AddrPortFrom(q.l3dst.Addr(), port)
	d.forwarded = q.trustedForwarded(d.upstream.Addr())
	// Authorization sees the real peer, never the forwarded client
	// (SPEC §4.3, TESTPLAN S8).
	d.authz = rbac.Conn{Src: q.src, Dst: d.upstream, Identity: q.srcID} // step 6
	d.decision = evaluate(q.snap, q.local, d.authz)
	if err := decisionErr(d.decision); err != nil {
		return d, &inboundError{http.StatusUnauthorized, telemetry.FlagDeny, err}
	}
	return d, nil
}

// targetPort validates the authority's destination (SPEC §2.4 step 4) and
// resolves the port it targets (step 5, before any application tunnel),
// recording a hostname authority's service in d.
func (q *connectQuery) targetPort(d *connectDecision) (uint16, *inboundError) {
	auth := d.authority
	if auth.host == "" {
		if auth.addr.Addr() != q.l3dst.Addr() && !q.reachesViaWaypoint(auth.addr.Addr()) {
			return 0, badRequest(errIPMismatch)
		}
		return auth.port, nil
	}
	svc, target := resolveHostname(q.snap, q.local, auth)
	if svc == nil {
		return 0, unavailable(errNoService)
	}
	d.service = svc
	if target == 0 {
		return 0, unavailable(errNoTargetPort)
	}
	return target, nil
}

// proxyDestination is the destination a PROXY header names (SPEC §2.7):
// an IP authority as given, which step 4 does not check for a workload with
// an application tunnel (the tunnel's server decides what to do with it);
// for a hostname authority, which PROXY cannot carry, a VIP of its service
// (proxyVIP) with the authority's port.
func (q *connectQuery) proxyDestination(d *connectDecision) (netip.AddrPort, *inboundError) {
	if d.authority.host == "" {
		return d.authority.addr, nil
	}
	vip, ok := proxyVIP(d.service.VIPs, q.network)
	if !ok {
		return netip.AddrPort{}, unavailable(fmt.Errorf("%w: %s", errNoServiceVIP, d.service.Key()))
	}
	return netip.AddrPortFrom(vip, d.authority.port), nil
}

// proxyVIP picks the VIP a PROXY header names for a hostname authority as
// ztunnel does (find_inbound_upstream): an IPv4 VIP on this node's network,
// else an IPv6 one there, else a VIP on another network; among equals the
// last listed (Rust's max_by_key keeps the last maximum). ok is false when
// the service has no VIP.
func proxyVIP(vips []state.NetworkAddress, network string) (vip netip.Addr, ok bool) {
	best := -1
	for _, v := range vips {
		rank := 0
		if v.Network == network {
			rank = 1
			if v.Address.Is4() {
				rank = 2
			}
		}
		if rank >= best {
			vip, best = v.Address, rank
		}
	}
	return vip, best >= 0
}

// reachesViaWaypoint reports whether target (the authority IP) may be served
// by the local workload although it is not the address the connection
// reached: the local workload has an application tunnel, or it is the
// waypoint of the workload or service at target (SPEC §2.4 step 4).
func (q *connectQuery) reachesViaWaypoint(target netip.Addr) bool {
	if q.local.ApplicationTunnel != nil {
		return true
	}
	if w := q.snap.WorkloadByIP(q.network, target); w != nil {
		return q.isLocalWaypoint(w.Waypoint)
	}
	if svc := q.snap.ServiceByVIP(q.network, target, q.local.Namespace); svc != nil {
		return q.isLocalWaypoint(svc.Waypoint)
	}
	return false
}

// isLocalWaypoint reports whether gw, a target's waypoint, is the local
// workload, resolving it as ztunnel does (find_destination): an address is a
// workload's IP or else a service VIP, a hostname a service or else a
// workload. A service waypoint must have the local workload among its
// endpoints; a workload waypoint must own the L3 destination, on any of its
// IPs (a dual-stack waypoint may be reached on either).
func (q *connectQuery) isLocalWaypoint(gw *state.GatewayAddress) bool {
	w, svc := q.resolveGateway(gw)
	switch {
	case svc != nil:
		return svc.Endpoints.Has(q.local.UID)
	case w != nil:
		return slices.Contains(w.Addresses, q.l3dst.Addr())
	}
	return false
}

// resolveGateway finds the workload or the service gw names, as ztunnel
// does (find_destination): an address is a workload's IP or else a service
// VIP, a hostname a service or else a workload. Both are nil when gw is nil
// or names nothing known.
func (q *connectQuery) resolveGateway(gw *state.GatewayAddress) (w *state.Workload, svc *state.Service) {
	switch {
	case gw == nil:
	case gw.Address != nil:
		ip := gw.Address.Address.Unmap()
		if w = q.snap.WorkloadByIP(gw.Address.Network, ip); w == nil {
			svc = q.snap.ServiceByVIP(gw.Address.Network, ip, q.local.Namespace)
		}
	case gw.Hostname != nil:
		if svc = q.snap.ServiceByKey(gw.Hostname.Namespace + "/" + gw.Hostname.Hostname); svc == nil {
			w = q.snap.WorkloadByHostname(gw.Hostname.Namespace, gw.Hostname.Hostname)
		}
	}
	return w, svc
}

// Kubelet probe addresses: istio-cni SNATs the kubelet's probes to these
// and its in-pod rules let them reach the pod without the proxy, so a
// forwarded source may never claim one (SPEC §1.3).
var (
	probeAddr4 = netip.AddrFrom4([4]byte{169, 254, 7, 127})
	probeAddr6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
	broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// trustedForwarded returns the request's Forwarded for= IP when the peer is
// a waypoint of the local workload (peerIsLocalWaypoint) and the IP can be
// the source of a connection to dst: same family, a unicast address that is
// not a kubelet probe address, and loopback only toward loopback. Otherwise
// it returns the zero Addr and the peer's IP stays the source (SPEC §2.5;
// ztunnel before #908).
func (q *connectQuery) trustedForwarded(dst netip.Addr) netip.Addr {
	fwd := q.forwardedFor
	switch {
	case !fwd.IsValid(), fwd.Is4() != dst.Is4(), fwd.IsLoopback() != dst.IsLoopback(),
		fwd.IsUnspecified(), fwd.IsMulticast(), fwd.IsLinkLocalUnicast(), fwd == broadcast4,
		fwd == probeAddr4, fwd == probeAddr6:
		return netip.Addr{}
	case !q.peerIsLocalWaypoint():
		return netip.Addr{}
	}
	return fwd
}

// peerIsLocalWaypoint reports whether the HBONE peer is a waypoint of the
// local workload: the workload at the peer's IP has the peer certificate's
// identity, and it is, or is an endpoint of, the waypoint of the local
// workload or of one of its services in the workload's own namespace
// (including weighted waypoints). Both the identity and the IP must match,
// as in ztunnel's check_from_waypoint before #908 and in isFromWaypoint on
// the outbound side. A service of another namespace is skipped: istiod
// lists it in the pod's services when that namespace's EndpointSlice
// targets the pod, which the pod's owner does not control, so its waypoint
// is not one the pod chose.
func (q *connectQuery) peerIsLocalWaypoint() bool {
	if q.srcID.IsZero() {
		return false
	}
	peer := q.snap.WorkloadByIP(q.network, q.src.Addr())
	if peer == nil || peer.Identity() != q.srcID {
		return false
	}
	if q.gatewayIncludes(q.local.Waypoint, peer) {
		return true
	}
	for key := range q.local.Services {
		svc := q.snap.ServiceByKey(key)
		if svc == nil || svc.Namespace != q.local.Namespace {
			continue
		}
		if q.gatewayIncludes(svc.Waypoint, peer) {
			return true
		}
		for i := range svc.WeightedWaypoints {
			if q.gatewayIncludes(&svc.WeightedWaypoints[i].Destination, peer) {
				return true
			}
		}
	}
	return false
}

// gatewayIncludes reports whether gw resolves to w or to a service w is an
// endpoint of.
func (q *connectQuery) gatewayIncludes(gw *state.GatewayAddress, w *state.Workload) bool {
	gwl, svc := q.resolveGateway(gw)
	switch {
	case svc != nil:
		return svc.Endpoints.Has(w.UID)
	case gwl != nil:
		return gwl.UID == w.UID
	}
	return false
}

// resolveHostname finds the service a hostname authority names, preferring
// the local workload's namespace, and the target port for this workload:
// its endpoint's port mapping, else the service's (0 when neither has one).
func resolveHostname(snap *state.Snapshot, local *state.Workload, auth authority) (*state.Service, uint16) {
	var svc *state.Service
	for _, s := range snap.ServicesByHostname(auth.host) {
		if s.Visibility == state.VisibilityNamespace && s.Namespace != local.Namespace {
			continue
		}
		if svc == nil || s.Namespace == local.Namespace {
			svc = s
		}
	}
	if svc == nil {
		return nil, 0
	}
	if ep, ok := svc.Endpoints.Get(local.UID); ok {
		if t := ep.Ports[auth.port]; t != 0 {
			return svc, t
		}
	}
	return svc, svc.Ports[auth.port]
}

// authorize applies the local workload's L4 policies (SPEC §4) to c. The
// error names the deciding policy or the reason.
func authorize(snap *state.Snapshot, local *state.Workload, c rbac.Conn) error {
	return decisionErr(evaluate(snap, local, c))
}

// evaluate decides c against the local workload's L4 policies (SPEC §4).
func evaluate(snap *state.Snapshot, local *state.Workload, c rbac.Conn) rbac.Decision {
	return rbac.Evaluate(snap, rbac.Target{Namespace: local.Namespace, PolicyRefs: local.AuthorizationPolicies}, c)
}

// decisionErr is nil for an allowing d, else an errDenied naming why.
func decisionErr(d rbac.Decision) error {
	if d.Allow {
		return nil
	}
	return fmt.Errorf("%w: %s", errDenied, d)
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
