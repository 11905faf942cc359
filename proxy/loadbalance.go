package proxy

import (
	"github.com/gozt/gozt/state"
)

// pickEndpoint load-balances svc for a request to service port svcPort
// (SPEC §3.3). svcPort 0 means waypoint/gateway resolution, where no port
// mapping is required. It returns the chosen workload and the target port.
// It allocates nothing: one pass ranks, a second pass samples by capacity.
func (r *router) pickEndpoint(svc *state.Service, svcPort uint16, src *state.Workload) (*state.Workload, uint16, bool) {
	svcTarget, hasPort := uint16(0), true
	if svcPort != 0 {
		svcTarget, hasPort = svc.Ports[svcPort]
		if !hasPort {
			return nil, 0, false
		}
	}
	var prefs []state.LBScope
	strict := false
	if lb := svc.LoadBalancer; lb != nil && (lb.Mode == state.LBFailover || lb.Mode == state.LBStrict) {
		prefs = lb.RoutingPreference
		strict = lb.Mode == state.LBStrict
	}
	bestRank, total := -1, uint64(0)
	for uid, ep := range svc.Endpoints.All() {
		w, _, ok := r.candidate(uid, ep, svcPort, svcTarget)
		if !ok {
			continue
		}
		rank, ok := endpointRank(prefs, strict, src, w)
		if !ok {
			continue
		}
		switch {
		case rank > bestRank:
			bestRank, total = rank, uint64(w.Weight())
		case rank == bestRank:
			total += uint64(w.Weight())
		}
	}
	if total == 0 {
		return nil, 0, false
	}
	n := r.randN(total)
	for uid, ep := range svc.Endpoints.All() {
		w, port, ok := r.candidate(uid, ep, svcPort, svcTarget)
		if !ok {
			continue
		}
		if rank, ok := endpointRank(prefs, strict, src, w); !ok || rank != bestRank {
			continue
		}
		if weight := uint64(w.Weight()); n < weight {
			return w, port, true
		} else {
			n -= weight
		}
	}
	// Unreachable unless the snapshot changed under us, which it cannot.
	return nil, 0, false
}

// candidate reports whether endpoint ep can serve the request and its port.
// A workload needs an IP or a hostname, resolved at connect time, or, on
// another network, a network gateway to reach it through (SPEC §3.3). WDS
// sends the gateway whatever the client's network, so on the local network
// it is never used.
func (r *router) candidate(uid string, ep state.Endpoint, svcPort, svcTarget uint16) (*state.Workload, uint16, bool) {
	w := r.snap.WorkloadByUID(uid)
	if w == nil {
		return nil, 0, false
	}
	if len(w.Addresses) == 0 && w.Hostname == "" && (w.Network == r.network || w.NetworkGateway == nil) {
		return nil, 0, false
	}
	if svcPort == 0 {
		return w, 0, true
	}
	port := svcTarget
	if p := ep.Ports[svcPort]; p != 0 {
		port = p
	}
	if port == 0 {
		if w.ApplicationTunnel != nil && w.ApplicationTunnel.Port != 0 {
			return w, svcPort, true
		}
		return nil, 0, false
	}
	return w, port, true
}

// endpointRank ranks w for a client src under routing preferences prefs
// (SPEC §3.3, as ztunnel's load_balance computes it): the preferences w
// shares with src, counted from the first until one differs. NETWORK as the
// first preference is special: a network mismatch skips it instead of
// stopping, and a network match also adds len(prefs)-1, so same-network
// endpoints outrank every other. ok is false when STRICT drops w because it
// does not share every preference; that check comes before the network
// bonus.
func endpointRank(prefs []state.LBScope, strict bool, src, w *state.Workload) (rank int, ok bool) {
	if len(prefs) == 0 || src == nil {
		return 0, true
	}
	networkFirst := prefs[0] == state.ScopeNetwork
	bonus := 0
	for _, p := range prefs {
		var match bool
		switch p {
		case state.ScopeRegion:
			match = src.Locality.Region == w.Locality.Region
		case state.ScopeZone:
			match = src.Locality.Zone == w.Locality.Zone
		case state.ScopeSubzone:
			match = src.Locality.Subzone == w.Locality.Subzone
		case state.ScopeNode:
			match = src.Node == w.Node
		case state.ScopeCluster:
			match = src.ClusterID == w.ClusterID
		case state.ScopeNetwork:
			match = src.Network == w.Network
			if networkFirst {
				if !match {
					continue // try the other scopes
				}
				bonus = len(prefs) - 1
			}
		}
		if !match {
			break
		}
		rank++
	}
	if strict && rank != len(prefs) {
		return 0, false
	}
	return rank + bonus, true
}
