package xds

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// gen makes random values in the form the *FromProto functions return them
// (defaults applied, empty lists nil), for property tests.
type gen struct{ r *rand.Rand }

func newGen(seed uint64) *gen { return &gen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} }

func (g *gen) chance(n int) bool { return g.r.IntN(n) == 0 }

func (g *gen) str(prefix string) string { return fmt.Sprintf("%s%d", prefix, g.r.IntN(1000)) }

// maybe returns "" half of the time.
func (g *gen) maybe(prefix string) string {
	if g.chance(2) {
		return ""
	}
	return g.str(prefix)
}

func (g *gen) addr() netip.Addr {
	switch g.r.IntN(3) {
	case 0:
		return netip.AddrFrom4([4]byte{10, byte(g.r.IntN(256)), byte(g.r.IntN(256)), byte(g.r.IntN(256))})
	case 1:
		return netip.AddrFrom16([16]byte{0xfd, 15: byte(g.r.IntN(256))})
	}
	// IPv4-mapped IPv6, kept as sent (the store unmaps it).
	return netip.AddrFrom16(netip.AddrFrom4([4]byte{10, 1, 2, byte(g.r.IntN(256))}).As16())
}

func (g *gen) ports() state.PortMap {
	n := g.r.IntN(3)
	if n == 0 {
		return nil
	}
	pm := state.PortMap{}
	for range n {
		pm[uint16(g.r.IntN(65536))] = uint16(g.r.IntN(65536))
	}
	return pm
}

func (g *gen) strs(prefix string) []string {
	var out []string
	for range g.r.IntN(3) {
		out = append(out, g.str(prefix))
	}
	return out
}

func (g *gen) gateway() *state.GatewayAddress {
	gw := &state.GatewayAddress{HBONEMTLSPort: uint16(g.r.IntN(65536))}
	if g.chance(2) {
		gw.Hostname = &state.NamespacedHostname{Namespace: g.str("ns"), Hostname: g.str("h")}
	} else {
		gw.Address = &state.NetworkAddress{Network: g.maybe("net"), Address: g.addr()}
	}
	return gw
}

func (g *gen) workload() *state.Workload {
	w := &state.Workload{
		UID:               g.str("uid"),
		Name:              g.maybe("name"),
		Namespace:         g.maybe("ns"),
		Hostname:          g.maybe("host"),
		Network:           g.maybe("net"),
		Protocol:          state.TunnelProtocol(g.r.IntN(2)),
		TrustDomain:       g.str("td"),
		ServiceAccount:    g.str("sa"),
		Node:              g.maybe("node"),
		CanonicalName:     g.maybe("cn"),
		CanonicalRevision: g.maybe("cr"),
		WorkloadType:      state.WorkloadType(g.r.IntN(4)),
		WorkloadName:      g.maybe("wn"),
		NativeTunnel:      g.chance(2),
		Status:            state.HealthStatus(g.r.IntN(2)),
		ClusterID:         g.str("c"),
		NetworkMode:       state.NetworkMode(g.r.IntN(2)),
		Capacity:          uint32(g.r.IntN(5)),
	}
	for range g.r.IntN(3) {
		w.Addresses = append(w.Addresses, g.addr())
	}
	if g.chance(2) {
		w.Waypoint = g.gateway()
	}
	if g.chance(3) {
		w.NetworkGateway = g.gateway()
	}
	if g.chance(3) {
		w.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelProtocol(g.r.IntN(2)), Port: uint16(g.r.IntN(65536))}
	}
	if n := g.r.IntN(3); n > 0 {
		w.Services = map[string]state.PortMap{}
		for range n {
			w.Services[g.str("ns")+"/"+g.str("svc")] = g.ports()
		}
	}
	w.AuthorizationPolicies = g.strs("ns/p")
	if g.chance(2) {
		w.Locality = state.Locality{Region: g.maybe("r"), Zone: g.maybe("z"), Subzone: g.maybe("s")}
	}
	return w
}

func (g *gen) service() *state.Service {
	s := &state.Service{
		Name:            g.maybe("name"),
		Namespace:       g.str("ns"),
		Hostname:        g.str("h") + ".example",
		Ports:           g.ports(),
		SubjectAltNames: g.strs("spiffe://td/ns/x/sa/"),
		IPFamilies:      state.IPFamilies(g.r.IntN(4)),
		Canonical:       g.chance(2),
		Visibility:      state.Visibility(g.r.IntN(2)),
	}
	for range g.r.IntN(3) {
		s.VIPs = append(s.VIPs, state.NetworkAddress{Network: g.maybe("net"), Address: g.addr()})
	}
	for range g.r.IntN(2) {
		a := g.addr()
		s.CIDRVIPs = append(s.CIDRVIPs, state.NetworkPrefix{Network: g.maybe("net"), Prefix: netip.PrefixFrom(a, g.r.IntN(a.BitLen()))})
	}
	if g.chance(2) {
		s.Waypoint = g.gateway()
	}
	for range g.r.IntN(2) {
		s.WeightedWaypoints = append(s.WeightedWaypoints, state.WeightedWaypoint{Destination: *g.gateway(), Weight: uint32(g.r.IntN(100))})
	}
	if g.chance(2) {
		lb := &state.LoadBalancer{Mode: state.LBMode(g.r.IntN(4)), HealthPolicy: state.HealthPolicy(g.r.IntN(2))}
		for range g.r.IntN(3) {
			lb.RoutingPreference = append(lb.RoutingPreference, state.LBScope(1+g.r.IntN(6)))
		}
		s.LoadBalancer = lb
	}
	return s
}

func (g *gen) stringMatches() []rbac.StringMatch {
	var out []rbac.StringMatch
	for range g.r.IntN(3) {
		k := rbac.MatchKind(g.r.IntN(4))
		v := g.str("v")
		if k == rbac.Presence {
			v = ""
		}
		out = append(out, rbac.StringMatch{Kind: k, Value: v})
	}
	return out
}

func (g *gen) prefixes() []netip.Prefix {
	var out []netip.Prefix
	for range g.r.IntN(3) {
		a := netip.AddrFrom4([4]byte{10, byte(g.r.IntN(256)), 0, 0})
		if g.chance(2) {
			a = netip.AddrFrom16([16]byte{0xfd, 1: byte(g.r.IntN(256))})
		}
		out = append(out, netip.PrefixFrom(a, g.r.IntN(a.BitLen()+1)))
	}
	return out
}

func (g *gen) portList() []uint16 {
	var out []uint16
	for range g.r.IntN(3) {
		out = append(out, uint16(g.r.IntN(65536)))
	}
	return out
}

func (g *gen) serviceAccounts() []rbac.ServiceAccountMatch {
	var out []rbac.ServiceAccountMatch
	for range g.r.IntN(3) {
		out = append(out, rbac.ServiceAccountMatch{Namespace: g.str("ns"), ServiceAccount: g.str("sa")})
	}
	return out
}

func (g *gen) match() rbac.Match {
	return rbac.Match{
		Namespaces:          g.stringMatches(),
		NotNamespaces:       g.stringMatches(),
		Principals:          g.stringMatches(),
		NotPrincipals:       g.stringMatches(),
		SourceIPs:           g.prefixes(),
		NotSourceIPs:        g.prefixes(),
		DestinationIPs:      g.prefixes(),
		NotDestinationIPs:   g.prefixes(),
		DestinationPorts:    g.portList(),
		NotDestinationPorts: g.portList(),
		ServiceAccounts:     g.serviceAccounts(),
		NotServiceAccounts:  g.serviceAccounts(),
	}
}

func (g *gen) policy() *rbac.Policy {
	p := &rbac.Policy{
		Name:      g.str("p"),
		Namespace: g.str("ns"),
		Scope:     rbac.Scope(g.r.IntN(3)),
		Action:    rbac.Action(g.r.IntN(2)),
		DryRun:    g.chance(2),
	}
	for range g.r.IntN(3) {
		var r rbac.Rule
		for range g.r.IntN(3) {
			var c rbac.Clause
			for range g.r.IntN(3) {
				c.Matches = append(c.Matches, g.match())
			}
			r.Clauses = append(r.Clauses, c)
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}
