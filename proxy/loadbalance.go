package proxy

import (
	"github.com/gozt/gozt/proxy/state"
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
	for uid, ep := range svc.Endpoints {
		w, _, ok := r.candidate(uid, ep, svcPort, svcTarget)
		if !ok {
			continue
		}
		rank := localityRank(prefs, src, w)
		if strict && rank < len(prefs) {
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
	for uid, ep := range svc.Endpoints {
		w, port, ok := r.candidate(uid, ep, svcPort, svcTarget)
		if !ok || localityRank(prefs, src, w) != bestRank {
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
func (r *router) candidate(uid string, ep state.Endpoint, svcPort, svcTarget uint16) (*state.Workload, uint16, bool) {
	w := r.snap.WorkloadByUID(uid)
	if w == nil || len(w.Addresses) == 0 {
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

// localityRank counts how many routing preferences, from the first, w shares
// with src, stopping at the first mismatch (SPEC §3.3). NETWORK as the first
// preference is special: a network match adds len-1, a mismatch skips the
// criterion instead of stopping.
func localityRank(prefs []state.LBScope, src, w *state.Workload) int {
	if len(prefs) == 0 || src == nil {
		return 0
	}
	rank := 0
	for i, p := range prefs {
		match := false
		switch p {
		case state.ScopeRegion:
			match = src.Locality.Region == w.Locality.Region
		case state.ScopeZone:
			match = src.Locality.Region == w.Locality.Region && src.Locality.Zone == w.Locality.Zone
		case state.ScopeSubzone:
			match = src.Locality.Region == w.Locality.Region && src.Locality.Zone == w.Locality.Zone &&
				src.Locality.Subzone == w.Locality.Subzone
		case state.ScopeNode:
			match = src.Node == w.Node
		case state.ScopeCluster:
			match = src.ClusterID == w.ClusterID
		case state.ScopeNetwork:
			if i == 0 {
				if src.Network == w.Network {
					rank += len(prefs) - 1
				}
				continue
			}
			match = src.Network == w.Network
		}
		if !match {
			break
		}
		rank++
	}
	return rank
}
