package xds

import (
	"net/netip"
	"slices"

	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// The *ToProto functions are the inverse of the *FromProto ones, for the
// round-trip tests and fuzz seeds: for any value v returned by a FromProto
// function, FromProto(ToProto(v)) equals v. They do not validate, share v's
// string slices, and list ports sorted by service port.

// WorkloadToProto converts w to its wire form. Capacity is always sent,
// even 0 (which the data path treats as 1).
func WorkloadToProto(w *state.Workload) *workloadapi.Workload {
	p := &workloadapi.Workload{
		Uid:                   w.UID,
		Name:                  w.Name,
		Namespace:             w.Namespace,
		Hostname:              w.Hostname,
		Network:               w.Network,
		TunnelProtocol:        workloadapi.TunnelProtocol(w.Protocol),
		TrustDomain:           w.TrustDomain,
		ServiceAccount:        w.ServiceAccount,
		Waypoint:              gatewayToProto(w.Waypoint),
		NetworkGateway:        gatewayToProto(w.NetworkGateway),
		Node:                  w.Node,
		CanonicalName:         w.CanonicalName,
		CanonicalRevision:     w.CanonicalRevision,
		WorkloadType:          workloadapi.WorkloadType(w.WorkloadType),
		WorkloadName:          w.WorkloadName,
		NativeTunnel:          w.NativeTunnel,
		AuthorizationPolicies: w.AuthorizationPolicies,
		Status:                workloadapi.WorkloadStatus(w.Status),
		ClusterId:             w.ClusterID,
		NetworkMode:           workloadapi.NetworkMode(w.NetworkMode),
	}
	for _, a := range w.Addresses {
		p.Addresses = append(p.Addresses, a.AsSlice())
	}
	if t := w.ApplicationTunnel; t != nil {
		p.ApplicationTunnel = &workloadapi.ApplicationTunnel{
			Protocol: workloadapi.ApplicationTunnel_Protocol(t.Protocol),
			Port:     uint32(t.Port),
		}
	}
	if len(w.Services) > 0 {
		p.Services = make(map[string]*workloadapi.PortList, len(w.Services))
		for key, pm := range w.Services {
			p.Services[key] = &workloadapi.PortList{Ports: portMapToProto(pm)}
		}
	}
	if !w.Locality.IsZero() {
		p.Locality = &workloadapi.Locality{Region: w.Locality.Region, Zone: w.Locality.Zone, Subzone: w.Locality.Subzone}
	}
	p.Capacity = wrapperspb.UInt32(w.Capacity)
	return p
}

// ServiceToProto converts s to its wire form; s.Endpoints is not part of it.
func ServiceToProto(s *state.Service) *workloadapi.Service {
	p := &workloadapi.Service{
		Name:            s.Name,
		Namespace:       s.Namespace,
		Hostname:        s.Hostname,
		Ports:           portMapToProto(s.Ports),
		SubjectAltNames: s.SubjectAltNames,
		Waypoint:        gatewayToProto(s.Waypoint),
		IpFamilies:      workloadapi.IPFamilies(s.IPFamilies),
		Canonical:       s.Canonical,
		Visibility:      workloadapi.Service_Visibility(s.Visibility),
	}
	for _, v := range s.VIPs {
		p.Addresses = append(p.Addresses, &workloadapi.NetworkAddress{Network: v.Network, Address: v.Address.AsSlice()})
	}
	for _, c := range s.CIDRVIPs {
		bits := uint32(c.Prefix.Bits())
		p.Addresses = append(p.Addresses, &workloadapi.NetworkAddress{
			Network: c.Network, Address: c.Prefix.Addr().AsSlice(), Length: &bits,
		})
	}
	for _, ww := range s.WeightedWaypoints {
		p.WeightedWaypoints = append(p.WeightedWaypoints, &workloadapi.WeightedWaypoint{
			Destination: gatewayToProto(&ww.Destination), Weight: ww.Weight,
		})
	}
	if lb := s.LoadBalancer; lb != nil {
		p.LoadBalancing = &workloadapi.LoadBalancing{
			Mode:         workloadapi.LoadBalancing_Mode(lb.Mode),
			HealthPolicy: workloadapi.LoadBalancing_HealthPolicy(lb.HealthPolicy),
		}
		for _, sc := range lb.RoutingPreference {
			p.LoadBalancing.RoutingPreference = append(p.LoadBalancing.RoutingPreference, workloadapi.LoadBalancing_Scope(sc))
		}
	}
	return p
}

// PolicyToProto converts p to its wire form.
func PolicyToProto(p *rbac.Policy) *security.Authorization {
	out := &security.Authorization{
		Name:      p.Name,
		Namespace: p.Namespace,
		Scope:     security.Scope(p.Scope),
		Action:    security.Action(p.Action),
		DryRun:    p.DryRun,
	}
	for _, r := range p.Rules {
		g := &security.Group{}
		for _, c := range r.Clauses {
			rs := &security.Rules{}
			for i := range c.Matches {
				rs.Matches = append(rs.Matches, matchToProto(&c.Matches[i]))
			}
			g.Rules = append(g.Rules, rs)
		}
		out.Groups = append(out.Groups, g)
	}
	return out
}

func matchToProto(m *rbac.Match) *security.Match {
	return &security.Match{
		Namespaces:          stringMatchesToProto(m.Namespaces),
		NotNamespaces:       stringMatchesToProto(m.NotNamespaces),
		Principals:          stringMatchesToProto(m.Principals),
		NotPrincipals:       stringMatchesToProto(m.NotPrincipals),
		SourceIps:           prefixesToProto(m.SourceIPs),
		NotSourceIps:        prefixesToProto(m.NotSourceIPs),
		DestinationIps:      prefixesToProto(m.DestinationIPs),
		NotDestinationIps:   prefixesToProto(m.NotDestinationIPs),
		DestinationPorts:    portsToProto(m.DestinationPorts),
		NotDestinationPorts: portsToProto(m.NotDestinationPorts),
		ServiceAccounts:     serviceAccountsToProto(m.ServiceAccounts),
		NotServiceAccounts:  serviceAccountsToProto(m.NotServiceAccounts),
	}
}

func stringMatchesToProto(in []rbac.StringMatch) []*security.StringMatch {
	var out []*security.StringMatch
	for _, sm := range in {
		p := &security.StringMatch{}
		switch sm.Kind {
		case rbac.Exact:
			p.MatchType = &security.StringMatch_Exact{Exact: sm.Value}
		case rbac.Prefix:
			p.MatchType = &security.StringMatch_Prefix{Prefix: sm.Value}
		case rbac.Suffix:
			p.MatchType = &security.StringMatch_Suffix{Suffix: sm.Value}
		case rbac.Presence:
			p.MatchType = &security.StringMatch_Presence{Presence: &emptypb.Empty{}}
		}
		out = append(out, p)
	}
	return out
}

func prefixesToProto(in []netip.Prefix) []*security.Address {
	var out []*security.Address
	for _, p := range in {
		out = append(out, &security.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())})
	}
	return out
}

func portsToProto(in []uint16) []uint32 {
	var out []uint32
	for _, p := range in {
		out = append(out, uint32(p))
	}
	return out
}

func serviceAccountsToProto(in []rbac.ServiceAccountMatch) []*security.ServiceAccountMatch {
	var out []*security.ServiceAccountMatch
	for _, sa := range in {
		out = append(out, &security.ServiceAccountMatch{Namespace: sa.Namespace, ServiceAccount: sa.ServiceAccount})
	}
	return out
}

func gatewayToProto(g *state.GatewayAddress) *workloadapi.GatewayAddress {
	if g == nil {
		return nil
	}
	p := &workloadapi.GatewayAddress{HboneMtlsPort: uint32(g.HBONEMTLSPort)}
	switch {
	case g.Hostname != nil:
		p.Destination = &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
			Namespace: g.Hostname.Namespace, Hostname: g.Hostname.Hostname,
		}}
	case g.Address != nil:
		p.Destination = &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Network: g.Address.Network, Address: g.Address.Address.AsSlice(),
		}}
	}
	return p
}

// portMapToProto lists pm's entries sorted by service port.
func portMapToProto(pm state.PortMap) []*workloadapi.Port {
	if len(pm) == 0 {
		return nil
	}
	keys := make([]uint16, 0, len(pm))
	for k := range pm {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]*workloadapi.Port, len(keys))
	for i, k := range keys {
		out[i] = &workloadapi.Port{ServicePort: uint32(k), TargetPort: uint32(pm[k])}
	}
	return out
}
