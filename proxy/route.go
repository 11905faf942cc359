package proxy

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/gozt/gozt/state"
)

// This file holds the pure outbound routing decision (SPEC §3.2–3.5): no I/O,
// so it is tested without sockets.

// routeKind says how an outbound connection is carried.
type routeKind uint8

const (
	// routeHBONE tunnels the connection in an HBONE CONNECT stream.
	routeHBONE routeKind = iota
	// routeTCP connects in plain TCP to a workload that does not speak HBONE.
	routeTCP
	// routePassthrough connects in plain TCP to the original destination,
	// which is not part of the mesh (or is a PASSTHROUGH service).
	routePassthrough
)

func (k routeKind) String() string {
	switch k {
	case routeHBONE:
		return "HBONE"
	case routeTCP:
		return "TCP"
	case routePassthrough:
		return "passthrough"
	}
	return "unknown"
}

// route is the outcome of the outbound decision.
type route struct {
	kind      routeKind
	dial      netip.AddrPort // where to connect: podIP:15008 for HBONE, ip:port otherwise
	authority string         // CONNECT :authority (HBONE only)
	sans      []string       // expected server SPIFFE ids (HBONE only), sorted
	workload  *state.Workload
	service   *state.Service // the service the original destination addressed, or nil
	waypoint  bool           // the connection goes through a waypoint

	// port is the target port (a waypoint's HBONE port for a waypoint).
	port uint16
	// hostname, if not empty, is the hostname of the chosen workload, which
	// has no usable IP: dial (and authority) are set by setIP once it is
	// resolved at connect time, to an address of prefer's family if it has
	// one (SPEC §3.3, on-demand DNS).
	hostname string
	prefer   netip.Addr

	// inner, for double HBONE (SPEC §2.6), is the tunnel to the destination
	// carried inside this one, which then goes to the destination's network
	// gateway; nil for every other route.
	inner *innerTunnel
}

// innerTunnel is the inner half of a double HBONE route: a TLS session and
// HTTP/2 connection of its own over the stream to the gateway, never pooled,
// with the same authority as the outer CONNECT.
type innerTunnel struct {
	sans []string        // the destination service's subject_alt_names only, sorted
	dest *state.Workload // the workload or waypoint on the other network
}

// setIP completes the route to the workload's address ip.
func (rt *route) setIP(ip netip.Addr) {
	switch {
	case rt.waypoint:
		rt.dial = netip.AddrPortFrom(ip, rt.port)
	case rt.kind == routeHBONE:
		rt.dial = netip.AddrPortFrom(ip, HBONEPort)
		rt.authority = netip.AddrPortFrom(ip, rt.port).String()
	default:
		rt.dial = netip.AddrPortFrom(ip, rt.port)
	}
	rt.hostname = ""
}

// HBONEPort is the inbound HBONE port every mesh workload listens on.
const HBONEPort = 15008

// router makes outbound decisions against one snapshot.
type router struct {
	snap    *state.Snapshot
	network string
	rand    func(n uint64) uint64 // uniform in [0, n); nil means math/rand/v2
}

func (r *router) randN(n uint64) uint64 {
	if r.rand != nil {
		return r.rand(n)
	}
	return rand.Uint64N(n)
}

// decide routes a connection from src (the local workload) and downstream
// address to the original destination dst (SPEC §3.2, in that order).
func (r *router) decide(src *state.Workload, downstream netip.Addr, dst netip.AddrPort) (route, error) {
	ip := dst.Addr().Unmap()
	w := r.snap.WorkloadByIP(r.network, ip)
	var svc *state.Service
	if w == nil {
		svc = r.snap.ServiceByVIP(r.network, ip, src.Namespace)
	}
	if svc != nil {
		if gw := r.pickWaypoint(svc); gw != nil {
			return r.viaWaypoint(src, gw, dst, svc)
		}
		if svc.LoadBalancer != nil && svc.LoadBalancer.Mode == state.LBPassthrough {
			return route{kind: routePassthrough, dial: dst, service: svc}, nil
		}
		ep, port, ok := r.pickEndpoint(svc, dst.Port(), src)
		if !ok {
			return route{}, fmt.Errorf("%w for %s", errNoHealthyUpstream, svc.Hostname)
		}
		if ep.Network != r.network { // SPEC §3.2 step 5
			return r.throughGateway(src, ep, svc, svc, dst)
		}
		return r.direct(ep, r.selectIP(ep, ip, svc.IPFamilies), ip, port, svc)
	}
	if w == nil {
		return route{kind: routePassthrough, dial: dst}, nil
	}
	if w.Waypoint != nil && !isFromWaypoint(r.snap, r.network, src, downstream, w.Waypoint) {
		return r.viaWaypoint(src, w.Waypoint, dst, nil)
	}
	return r.direct(w, ip, ip, dst.Port(), nil)
}

// direct routes straight to workload w at ip:port; an invalid ip means w
// has no usable IP, and its hostname is resolved at connect time preferring
// orig's family.
func (r *router) direct(w *state.Workload, ip, orig netip.Addr, port uint16, svc *state.Service) (route, error) {
	if w.Network != r.network {
		// Only a service's endpoints are looked up on other networks;
		// ztunnel treats this as a bug (build_request's debug_assert).
		return route{}, fmt.Errorf("%w: workload %s on network %q", errRemoteNotService, w.UID, w.Network)
	}
	rt := route{kind: routeTCP, workload: w, service: svc, port: port}
	if w.Protocol == state.TunnelHBONE {
		rt.kind = routeHBONE
		rt.sans = expectedSANs(w, svc)
	}
	if err := rt.setIPOrHostname(ip, orig); err != nil {
		return route{}, err
	}
	return rt, nil
}

// setIPOrHostname completes the route to ip, or, when ip is invalid, leaves
// it to be resolved from the workload's hostname (SPEC §3.3).
func (rt *route) setIPOrHostname(ip, orig netip.Addr) error {
	switch {
	case ip.IsValid():
		rt.setIP(ip)
	case rt.workload.Hostname != "":
		rt.hostname, rt.prefer = rt.workload.Hostname, orig
	default:
		return fmt.Errorf("%w: workload %s has no usable address", errNoHealthyUpstream, rt.workload.UID)
	}
	return nil
}

// viaWaypoint routes to a waypoint; the authority stays the original
// destination (SPEC §3.2 steps 2 and 6).
func (r *router) viaWaypoint(src *state.Workload, gw *state.GatewayAddress, dst netip.AddrPort, svc *state.Service) (route, error) {
	wp, wpSvc, ip, orig, err := r.resolveGateway(gw, dst.Addr())
	if err != nil {
		return route{}, err
	}
	if wp.Network != r.network && svc != nil {
		// The inner tunnel ends at the waypoint: it expects the
		// waypoint service's SANs, as ztunnel's Upstream.service_sans.
		// A workload's waypoint (svc nil) is dialled directly whatever
		// its network, as ztunnel's build_request does.
		return r.throughGateway(src, wp, wpSvc, svc, dst)
	}
	port := gw.HBONEMTLSPort
	if port == 0 {
		port = HBONEPort
	}
	rt := route{
		kind:      routeHBONE,
		authority: dst.String(),
		sans:      expectedSANs(wp, wpSvc),
		workload:  wp,
		service:   svc,
		waypoint:  true,
		port:      port,
	}
	if err := rt.setIPOrHostname(ip, orig); err != nil {
		return route{}, err
	}
	return rt, nil
}

// throughGateway routes to up, a workload or waypoint on another network
// than the source, through up's network gateway (SPEC §2.6, ztunnel's
// build_request_through_gateway): the outer tunnel goes to the gateway and
// expects its SANs, the inner one expects upSvc's subject_alt_names (the
// addressed service for an endpoint, the waypoint's service for a
// waypoint), and both carry the authority svcHostname:servicePort, which
// is all the gateway needs to forward the inner bytes unread: svc, the
// service the connection addressed, is required.
func (r *router) throughGateway(src, up *state.Workload, upSvc, svc *state.Service, dst netip.AddrPort) (route, error) {
	if up.NetworkGateway == nil {
		return route{}, fmt.Errorf("%w: workload %s on network %q", errNoNetworkGateway, up.UID, up.Network)
	}
	gw, gwSvc, dial, err := r.resolveNetworkGateway(up.NetworkGateway, src, dst.Addr())
	if err != nil {
		return route{}, err
	}
	var inner []string
	if upSvc != nil {
		inner = slices.Clone(upSvc.SubjectAltNames)
		slices.Sort(inner)
	}
	return route{
		kind:      routeHBONE,
		dial:      dial,
		authority: net.JoinHostPort(svc.Hostname, strconv.Itoa(int(dst.Port()))),
		sans:      expectedSANs(gw, gwSvc),
		workload:  gw,
		service:   svc,
		port:      dial.Port(),
		inner:     &innerTunnel{sans: inner, dest: up},
	}, nil
}

// resolveNetworkGateway finds the gateway workload a network_gateway names
// and the address to dial (SPEC §3.5, ztunnel's fetch_network_gateway): an
// address is a workload's IP, dialled as given, or a service VIP,
// load-balanced on hbone_mtls_port; a hostname is a service, load-balanced
// likewise, or else a workload, reached at an IP of dst's family when it has
// one. svc is the gateway's service, or nil.
func (r *router) resolveNetworkGateway(ngw *state.GatewayAddress, src *state.Workload, dst netip.Addr) (w *state.Workload, svc *state.Service, dial netip.AddrPort, err error) {
	port := ngw.HBONEMTLSPort
	if port == 0 {
		port = HBONEPort
	}
	var ip netip.Addr
	switch {
	case ngw.Address != nil:
		addr := ngw.Address.Address.Unmap()
		if w = r.snap.WorkloadByIP(ngw.Address.Network, addr); w != nil {
			return w, nil, netip.AddrPortFrom(addr, port), nil
		}
		if svc = r.snap.ServiceByVIP(ngw.Address.Network, addr, src.Namespace); svc != nil {
			if w, port, _ = r.pickEndpoint(svc, port, src); w != nil {
				ip = r.selectIP(w, addr, svc.IPFamilies)
			}
		}
	case ngw.Hostname != nil:
		if svc = r.snap.ServiceByKey(ngw.Hostname.Namespace + "/" + ngw.Hostname.Hostname); svc != nil {
			w, port, _ = r.pickEndpoint(svc, port, src)
		} else {
			w = r.snap.WorkloadByHostname(ngw.Hostname.Namespace, ngw.Hostname.Hostname)
		}
		if w != nil {
			var fam state.IPFamilies
			if svc != nil {
				fam = svc.IPFamilies
			}
			ip = r.selectIP(w, dst, fam)
		}
	}
	if w == nil || !ip.IsValid() {
		return nil, nil, netip.AddrPort{}, fmt.Errorf("%w: %s", errUnknownNetworkGateway, ngw.Destination())
	}
	return w, svc, netip.AddrPortFrom(ip, port), nil
}

// resolveGateway finds the workload behind a waypoint or gateway address
// (SPEC §3.5) and the IP to dial, or an invalid IP when the workload has
// only a hostname, with the address whose family a resolved IP should share.
func (r *router) resolveGateway(gw *state.GatewayAddress, dst netip.Addr) (w *state.Workload, svc *state.Service, ip, orig netip.Addr, err error) {
	switch {
	case gw.Address != nil:
		addr := gw.Address.Address.Unmap()
		if w := r.snap.WorkloadByIP(gw.Address.Network, addr); w != nil {
			return w, nil, addr, addr, nil
		}
		if svc := r.snap.ServiceByVIP(gw.Address.Network, addr, ""); svc != nil {
			if w, _, ok := r.pickEndpoint(svc, 0, nil); ok {
				// The address as given picks the family, as ztunnel's
				// fetch_waypoint does: an IPv4 waypoint VIP is reached
				// over IPv4 even for an IPv6 destination.
				return w, svc, r.selectIP(w, addr, svc.IPFamilies), addr, nil
			}
		}
	case gw.Hostname != nil:
		if svc := r.snap.ServiceByKey(gw.Hostname.Namespace + "/" + gw.Hostname.Hostname); svc != nil {
			if w, _, ok := r.pickEndpoint(svc, 0, nil); ok {
				return w, svc, r.selectIP(w, dst, svc.IPFamilies), dst, nil
			}
		}
	}
	return nil, nil, netip.Addr{}, netip.Addr{}, errUnknownWaypoint
}

// pickWaypoint chooses the service's waypoint: weighted by weight when
// weighted waypoints are set with a non-zero sum, else the single waypoint.
func (r *router) pickWaypoint(svc *state.Service) *state.GatewayAddress {
	var sum uint64
	for _, ww := range svc.WeightedWaypoints {
		sum += uint64(ww.Weight)
	}
	if sum > 0 {
		n := r.randN(sum)
		for i := range svc.WeightedWaypoints {
			ww := &svc.WeightedWaypoints[i]
			if n < uint64(ww.Weight) {
				return &ww.Destination
			}
			n -= uint64(ww.Weight)
		}
	}
	return svc.Waypoint
}

// isFromWaypoint reports whether the connection comes from the destination's
// own waypoint (same identity and the downstream IP is one of its IPs), in
// which case the workload waypoint is not used again (SPEC §3.2 step 6).
func isFromWaypoint(snap *state.Snapshot, network string, src *state.Workload, downstream netip.Addr, gw *state.GatewayAddress) bool {
	if gw.Address == nil {
		return false
	}
	wp := snap.WorkloadByIP(gw.Address.Network, gw.Address.Address.Unmap())
	if wp == nil || wp.Identity() != src.Identity() {
		return false
	}
	return slices.Contains(wp.Addresses, downstream.Unmap())
}

// expectedSANs is the set of identities the server may present: the
// workload's identity plus the service's subject alt names, sorted.
func expectedSANs(w *state.Workload, svc *state.Service) []string {
	sans := []string{w.Identity().String()}
	if svc != nil {
		for _, s := range svc.SubjectAltNames {
			if !slices.Contains(sans, s) {
				sans = append(sans, s)
			}
		}
	}
	slices.Sort(sans)
	return sans
}

// selectIP picks which of w's addresses to dial (ztunnel's
// pick_workload_destination_or_resolve): the original destination if it is
// one of them, else, among those the service's ip_families allow, the first
// of orig's family, else the first. It returns an invalid address when none
// fits, for the hostname (if any) to be resolved.
func (r *router) selectIP(w *state.Workload, orig netip.Addr, fam state.IPFamilies) netip.Addr {
	var first, sameFamily netip.Addr
	for _, a := range w.Addresses {
		if a == orig {
			return a
		}
		if (fam == state.FamiliesIPv4Only && !a.Is4()) || (fam == state.FamiliesIPv6Only && a.Is4()) {
			continue
		}
		if !first.IsValid() {
			first = a
		}
		if !sameFamily.IsValid() && a.Is4() == orig.Is4() {
			sameFamily = a
		}
	}
	if sameFamily.IsValid() {
		return sameFamily
	}
	return first
}

// pickResolved picks one of a hostname's resolved addresses at random,
// among those of orig's family if there are any, as ztunnel's
// resolve_on_demand_dns does (SPEC §3.3); the service's ip_families do not
// apply to resolved addresses there either. It returns an invalid address
// for an empty list.
func (r *router) pickResolved(addrs []netip.Addr, orig netip.Addr) netip.Addr {
	same := 0
	for _, a := range addrs {
		if a.Unmap().Is4() == orig.Is4() {
			same++
		}
	}
	wantSame, n := same > 0, same
	if !wantSame {
		n = len(addrs)
	}
	if n == 0 {
		return netip.Addr{}
	}
	k := r.randN(uint64(n))
	for _, a := range addrs {
		a = a.Unmap()
		if wantSame && a.Is4() != orig.Is4() {
			continue
		}
		if k == 0 {
			return a
		}
		k--
	}
	return netip.Addr{} // unreachable
}
