package proxy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/gozt/gozt/proxy/state"
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
			return r.viaWaypoint(gw, dst, svc)
		}
		if svc.LoadBalancer != nil && svc.LoadBalancer.Mode == state.LBPassthrough {
			return route{kind: routePassthrough, dial: dst, service: svc}, nil
		}
		ep, port, ok := r.pickEndpoint(svc, dst.Port(), src)
		if !ok {
			return route{}, fmt.Errorf("%w for %s", errNoHealthyUpstream, svc.Hostname)
		}
		return r.direct(ep, r.selectIP(ep, ip), port, svc)
	}
	if w == nil {
		return route{kind: routePassthrough, dial: dst}, nil
	}
	if w.Waypoint != nil && !isFromWaypoint(r.snap, r.network, src, downstream, w.Waypoint) {
		return r.viaWaypoint(w.Waypoint, dst, nil)
	}
	return r.direct(w, ip, dst.Port(), nil)
}

// direct routes straight to workload w at ip:port.
func (r *router) direct(w *state.Workload, ip netip.Addr, port uint16, svc *state.Service) (route, error) {
	if w.Network != r.network {
		return route{}, errDoubleHBONE
	}
	if !ip.IsValid() {
		return route{}, fmt.Errorf("%w: workload %s has no usable address", errNoHealthyUpstream, w.UID)
	}
	rt := route{workload: w, service: svc}
	if w.Protocol != state.TunnelHBONE {
		rt.kind = routeTCP
		rt.dial = netip.AddrPortFrom(ip, port)
		return rt, nil
	}
	rt.kind = routeHBONE
	rt.dial = netip.AddrPortFrom(ip, HBONEPort)
	rt.authority = netip.AddrPortFrom(ip, port).String()
	rt.sans = expectedSANs(w, svc)
	return rt, nil
}

// viaWaypoint routes to a waypoint; the authority stays the original
// destination (SPEC §3.2 steps 2 and 6).
func (r *router) viaWaypoint(gw *state.GatewayAddress, dst netip.AddrPort, svc *state.Service) (route, error) {
	wp, wpSvc, ip, err := r.resolveGateway(gw, dst.Addr())
	if err != nil {
		return route{}, err
	}
	if wp.Network != r.network {
		return route{}, errDoubleHBONE
	}
	port := gw.HBONEMTLSPort
	if port == 0 {
		port = HBONEPort
	}
	return route{
		kind:      routeHBONE,
		dial:      netip.AddrPortFrom(ip, port),
		authority: dst.String(),
		sans:      expectedSANs(wp, wpSvc),
		workload:  wp,
		service:   svc,
		waypoint:  true,
	}, nil
}

// resolveGateway finds the workload behind a waypoint or gateway address
// (SPEC §3.5) and the IP to dial.
func (r *router) resolveGateway(gw *state.GatewayAddress, orig netip.Addr) (*state.Workload, *state.Service, netip.Addr, error) {
	switch {
	case gw.Address != nil:
		ip := gw.Address.Address.Unmap()
		if w := r.snap.WorkloadByIP(gw.Address.Network, ip); w != nil {
			return w, nil, ip, nil
		}
		if svc := r.snap.ServiceByVIP(gw.Address.Network, ip, ""); svc != nil {
			if w, _, ok := r.pickEndpoint(svc, 0, nil); ok {
				// The address as given picks the family, as ztunnel's
				// fetch_waypoint does: an IPv4 waypoint VIP is reached
				// over IPv4 even for an IPv6 destination.
				return w, svc, r.selectIP(w, ip), nil
			}
		}
	case gw.Hostname != nil:
		if svc := r.snap.ServiceByKey(gw.Hostname.Namespace + "/" + gw.Hostname.Hostname); svc != nil {
			if w, _, ok := r.pickEndpoint(svc, 0, nil); ok {
				return w, svc, r.selectIP(w, orig), nil
			}
		}
	}
	return nil, nil, netip.Addr{}, errUnknownWaypoint
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

// selectIP picks which of w's addresses to dial: the original destination if
// it is one of them, else one of the same family, else the first.
func (r *router) selectIP(w *state.Workload, orig netip.Addr) netip.Addr {
	var sameFamily netip.Addr
	for _, a := range w.Addresses {
		if a == orig {
			return a
		}
		if !sameFamily.IsValid() && a.Is4() == orig.Is4() {
			sameFamily = a
		}
	}
	if sameFamily.IsValid() {
		return sameFamily
	}
	if len(w.Addresses) > 0 {
		return w.Addresses[0]
	}
	return netip.Addr{}
}
