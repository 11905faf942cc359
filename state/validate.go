package state

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/gozt/gozt/rbac"
)

// ErrInvalid is wrapped by every validation error from Batch inserts.
var ErrInvalid = errors.New("state: invalid resource")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// validKey reports whether key looks like "namespace/name" with both parts
// non-empty and no further slash in the namespace.
func validKey(key string) bool {
	ns, name, ok := strings.Cut(key, "/")
	return ok && ns != "" && name != ""
}

func validateWorkload(w *Workload) error {
	if w == nil {
		return invalidf("nil workload")
	}
	if w.UID == "" {
		return invalidf("workload %s/%s: empty uid", w.Namespace, w.Name)
	}
	for _, a := range w.Addresses {
		if !a.IsValid() || a.Zone() != "" {
			return invalidf("workload %s: invalid address %v", w.UID, a)
		}
	}
	switch {
	case w.Protocol > TunnelHBONE:
		return invalidf("workload %s: unsupported tunnel protocol %d", w.UID, w.Protocol)
	case w.WorkloadType > WorkloadJob:
		return invalidf("workload %s: unknown workload type %d", w.UID, w.WorkloadType)
	case w.Status > StatusUnhealthy:
		return invalidf("workload %s: unknown status %d", w.UID, w.Status)
	case w.NetworkMode > NetworkHost:
		return invalidf("workload %s: unknown network mode %d", w.UID, w.NetworkMode)
	case w.ApplicationTunnel != nil && w.ApplicationTunnel.Protocol > AppTunnelProxy:
		return invalidf("workload %s: unknown application tunnel protocol %d", w.UID, w.ApplicationTunnel.Protocol)
	}
	if err := validateGateway(w.Waypoint); err != nil {
		return invalidf("workload %s: waypoint: %v", w.UID, err)
	}
	if err := validateGateway(w.NetworkGateway); err != nil {
		return invalidf("workload %s: network gateway: %v", w.UID, err)
	}
	for key := range w.Services {
		if !validKey(key) {
			return invalidf("workload %s: service key %q is not namespace/hostname", w.UID, key)
		}
	}
	return nil
}

// validateGateway checks that g (if set) has exactly one destination.
func validateGateway(g *GatewayAddress) error {
	switch {
	case g == nil:
		return nil
	case g.Hostname != nil && g.Address != nil:
		return errors.New("both hostname and address set")
	case g.Hostname != nil:
		if g.Hostname.Namespace == "" || g.Hostname.Hostname == "" {
			return errors.New("empty namespace or hostname")
		}
	case g.Address != nil:
		if !g.Address.Address.IsValid() {
			return errors.New("invalid address")
		}
	default:
		return errors.New("no destination")
	}
	return nil
}

func validateService(s *Service) error {
	if s == nil {
		return invalidf("nil service")
	}
	if s.Namespace == "" || s.Hostname == "" || strings.Contains(s.Namespace, "/") {
		return invalidf("service %q: namespace and hostname are required", s.Key())
	}
	for _, v := range s.VIPs {
		if !v.Address.IsValid() || v.Address.Zone() != "" {
			return invalidf("service %s: invalid vip %v", s.Key(), v.Address)
		}
	}
	for _, p := range s.CIDRVIPs {
		if !p.Prefix.IsValid() {
			return invalidf("service %s: invalid cidr vip %v", s.Key(), p.Prefix)
		}
	}
	if err := validateGateway(s.Waypoint); err != nil {
		return invalidf("service %s: waypoint: %v", s.Key(), err)
	}
	for i := range s.WeightedWaypoints {
		if err := validateGateway(&s.WeightedWaypoints[i].Destination); err != nil {
			return invalidf("service %s: weighted waypoint %d: %v", s.Key(), i, err)
		}
	}
	if lb := s.LoadBalancer; lb != nil {
		for _, sc := range lb.RoutingPreference {
			if sc < ScopeRegion || sc > ScopeNetwork {
				return invalidf("service %s: unknown routing preference %d", s.Key(), sc)
			}
		}
		if lb.Mode > LBPassthrough || lb.HealthPolicy > AllowAll {
			return invalidf("service %s: unknown load balancer mode or health policy", s.Key())
		}
	}
	if s.IPFamilies > FamiliesDual || s.Visibility > VisibilityNamespace {
		return invalidf("service %s: unknown ip families or visibility", s.Key())
	}
	return nil
}

func validatePolicy(p *rbac.Policy) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// normalizeService returns a shallow copy of s with addresses unmapped and
// CIDRs masked; Endpoints is cleared (the store fills it).
func normalizeService(s *Service) *Service {
	c := *s
	c.Endpoints = EndpointSet{}
	if needsUnmap(s.VIPs) {
		c.VIPs = make([]NetworkAddress, len(s.VIPs))
		for i, v := range s.VIPs {
			c.VIPs[i] = NetworkAddress{v.Network, v.Address.Unmap()}
		}
	}
	if len(s.CIDRVIPs) > 0 {
		c.CIDRVIPs = make([]NetworkPrefix, len(s.CIDRVIPs))
		for i, p := range s.CIDRVIPs {
			c.CIDRVIPs[i] = NetworkPrefix{p.Network, normalizePrefix(p.Prefix)}
		}
	}
	if c.Waypoint != nil {
		c.Waypoint = normalizeGateway(c.Waypoint)
	}
	return &c
}

func needsUnmap(vs []NetworkAddress) bool {
	for _, v := range vs {
		if v.Address.Is4In6() {
			return true
		}
	}
	return false
}

func normalizeGateway(g *GatewayAddress) *GatewayAddress {
	if g.Address == nil || !g.Address.Address.Is4In6() {
		return g
	}
	c := *g
	c.Address = &NetworkAddress{g.Address.Network, g.Address.Address.Unmap()}
	return &c
}

// normalizePrefix unmaps an IPv4-mapped prefix (::ffff:10.0.0.0/104 →
// 10.0.0.0/8) and masks the host bits.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			bits = 0
		}
		p = netip.PrefixFrom(a.Unmap(), bits)
	}
	return p.Masked()
}
