package xds

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// ServiceFromProto converts an istio.workload.Service (SPEC §5.4). It
// requires a namespace (without "/") and a hostname, splits addresses into
// VIPs (no length, or the full length) and CIDR VIPs (a shorter length), and
// rejects addresses that are not 4 or 16 bytes, lengths beyond the address
// size, ports above 65535, gateways without a destination, the
// UNSPECIFIED_SCOPE routing preference and unknown enum values, except for
// visibility, where an unknown value means PUBLIC as in ztunnel.
func ServiceFromProto(p *workloadapi.Service) (*state.Service, error) {
	if p == nil {
		return nil, errors.New("service: nil")
	}
	key := p.GetNamespace() + "/" + p.GetHostname()
	if p.GetNamespace() == "" || p.GetHostname() == "" || strings.Contains(p.GetNamespace(), "/") {
		return nil, fmt.Errorf("service %q: namespace and hostname are required", key)
	}
	s, err := serviceFromProto(p)
	if err != nil {
		return nil, fmt.Errorf("service %q: %w", key, err)
	}
	return s, nil
}

func serviceFromProto(p *workloadapi.Service) (*state.Service, error) {
	s := &state.Service{
		Name:            p.GetName(),
		Namespace:       p.GetNamespace(),
		Hostname:        p.GetHostname(),
		SubjectAltNames: nilIfEmpty(p.GetSubjectAltNames()),
		Canonical:       p.GetCanonical(),
		Visibility:      state.VisibilityPublic,
	}
	if p.GetVisibility() == workloadapi.Service_NAMESPACE {
		s.Visibility = state.VisibilityNamespace
	}
	ipf := p.GetIpFamilies()
	if ipf < workloadapi.IPFamilies_AUTOMATIC || ipf > workloadapi.IPFamilies_DUAL {
		return nil, fmt.Errorf("unknown ip_families %d", ipf)
	}
	s.IPFamilies = state.IPFamilies(ipf)
	if err := pbServiceAddresses(p.GetAddresses(), s); err != nil {
		return nil, err
	}
	var err error
	if s.Ports, err = pbPortMap(p.GetPorts()); err != nil {
		return nil, err
	}
	if s.Waypoint, err = pbGateway(p.GetWaypoint()); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	if s.WeightedWaypoints, err = pbWeightedWaypoints(p.GetWeightedWaypoints()); err != nil {
		return nil, err
	}
	if s.LoadBalancer, err = pbLoadBalancer(p.GetLoadBalancing()); err != nil {
		return nil, fmt.Errorf("load_balancing: %w", err)
	}
	return s, nil
}

// pbServiceAddresses fills s.VIPs and s.CIDRVIPs.
func pbServiceAddresses(addrs []*workloadapi.NetworkAddress, s *state.Service) error {
	for i, a := range addrs {
		ip, err := pbAddr(a.GetAddress())
		if err != nil {
			return fmt.Errorf("addresses[%d]: %w", i, err)
		}
		if a.Length == nil || int(a.GetLength()) == ip.BitLen() {
			s.VIPs = append(s.VIPs, state.NetworkAddress{Network: a.GetNetwork(), Address: ip})
			continue
		}
		if a.GetLength() > uint32(ip.BitLen()) {
			return fmt.Errorf("addresses[%d]: prefix length %d longer than %v", i, a.GetLength(), ip)
		}
		pfx := netip.PrefixFrom(ip, int(a.GetLength()))
		s.CIDRVIPs = append(s.CIDRVIPs, state.NetworkPrefix{Network: a.GetNetwork(), Prefix: pfx})
	}
	return nil
}

func pbWeightedWaypoints(ws []*workloadapi.WeightedWaypoint) ([]state.WeightedWaypoint, error) {
	if len(ws) == 0 {
		return nil, nil
	}
	out := make([]state.WeightedWaypoint, len(ws))
	for i, w := range ws {
		if w.GetDestination() == nil {
			return nil, fmt.Errorf("weighted_waypoints[%d]: no destination", i)
		}
		g, err := pbGateway(w.GetDestination())
		if err != nil {
			return nil, fmt.Errorf("weighted_waypoints[%d]: %w", i, err)
		}
		out[i] = state.WeightedWaypoint{Destination: *g, Weight: w.GetWeight()}
	}
	return out, nil
}

func pbLoadBalancer(lb *workloadapi.LoadBalancing) (*state.LoadBalancer, error) {
	if lb == nil {
		return nil, nil
	}
	out := &state.LoadBalancer{}
	for i, sc := range lb.GetRoutingPreference() {
		if sc <= workloadapi.LoadBalancing_UNSPECIFIED_SCOPE || sc > workloadapi.LoadBalancing_NETWORK {
			return nil, fmt.Errorf("routing_preference[%d]: invalid scope %d", i, sc)
		}
		out.RoutingPreference = append(out.RoutingPreference, state.LBScope(sc))
	}
	if m := lb.GetMode(); m < workloadapi.LoadBalancing_UNSPECIFIED_MODE || m > workloadapi.LoadBalancing_PASSTHROUGH {
		return nil, fmt.Errorf("unknown mode %d", m)
	}
	out.Mode = state.LBMode(lb.GetMode())
	if h := lb.GetHealthPolicy(); h != workloadapi.LoadBalancing_ONLY_HEALTHY && h != workloadapi.LoadBalancing_ALLOW_ALL {
		return nil, fmt.Errorf("unknown health_policy %d", h)
	}
	out.HealthPolicy = state.HealthPolicy(lb.GetHealthPolicy())
	return out, nil
}
