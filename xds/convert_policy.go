package xds

import (
	"errors"
	"fmt"
	"net/netip"

	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/rbac"
)

// PolicyFromProto converts an istio.security.Authorization (SPEC §4.1).
//
// Istio's Go package names the nesting levels groups/rules/matches where
// ztunnel (and rbac.Policy) say rules/clauses/matches; the field numbers are
// the same, so Authorization.groups become Policy.Rules, Group.rules become
// Rule.Clauses and Rules.matches become Clause.Matches.
//
// Unknown scope or action values are errors (the policy is NACKed rather
// than guessed at), as are a StringMatch with no kind, an address that is
// not 4 or 16 bytes or whose length exceeds it, and a port above 65535.
// Extensions are ignored. The result is checked with (*rbac.Policy).Validate.
func PolicyFromProto(p *security.Authorization) (*rbac.Policy, error) {
	if p == nil {
		return nil, errors.New("authorization: nil")
	}
	pol, err := policyFromProto(p)
	if err != nil {
		return nil, fmt.Errorf("authorization %q: %w", p.GetNamespace()+"/"+p.GetName(), err)
	}
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	return pol, nil
}

func policyFromProto(p *security.Authorization) (*rbac.Policy, error) {
	pol := &rbac.Policy{Name: p.GetName(), Namespace: p.GetNamespace(), DryRun: p.GetDryRun()}
	switch p.GetScope() {
	case security.Scope_GLOBAL:
		pol.Scope = rbac.Global
	case security.Scope_NAMESPACE:
		pol.Scope = rbac.Namespace
	case security.Scope_WORKLOAD_SELECTOR:
		pol.Scope = rbac.WorkloadSelector
	default:
		return nil, fmt.Errorf("unknown scope %d", p.GetScope())
	}
	switch p.GetAction() {
	case security.Action_ALLOW:
		pol.Action = rbac.Allow
	case security.Action_DENY:
		pol.Action = rbac.Deny
	default:
		return nil, fmt.Errorf("unknown action %d", p.GetAction())
	}
	if len(p.GetGroups()) > 0 {
		pol.Rules = make([]rbac.Rule, len(p.GetGroups()))
	}
	for gi, g := range p.GetGroups() {
		if len(g.GetRules()) > 0 {
			pol.Rules[gi].Clauses = make([]rbac.Clause, len(g.GetRules()))
		}
		for ri, r := range g.GetRules() {
			if len(r.GetMatches()) > 0 {
				pol.Rules[gi].Clauses[ri].Matches = make([]rbac.Match, len(r.GetMatches()))
			}
			for mi, m := range r.GetMatches() {
				if err := pbMatch(m, &pol.Rules[gi].Clauses[ri].Matches[mi]); err != nil {
					return nil, fmt.Errorf("groups[%d].rules[%d].matches[%d].%w", gi, ri, mi, err)
				}
			}
		}
	}
	return pol, nil
}

// pbMatch fills out from m. Its errors start with the field name, so the
// caller can join them to the path with a dot.
func pbMatch(m *security.Match, out *rbac.Match) error {
	var err error
	for _, f := range []struct {
		name string
		in   []*security.StringMatch
		out  *[]rbac.StringMatch
	}{
		{"namespaces", m.GetNamespaces(), &out.Namespaces},
		{"not_namespaces", m.GetNotNamespaces(), &out.NotNamespaces},
		{"principals", m.GetPrincipals(), &out.Principals},
		{"not_principals", m.GetNotPrincipals(), &out.NotPrincipals},
	} {
		if *f.out, err = pbStringMatches(f.in); err != nil {
			return fmt.Errorf("%s%w", f.name, err)
		}
	}
	for _, f := range []struct {
		name string
		in   []*security.Address
		out  *[]netip.Prefix
	}{
		{"source_ips", m.GetSourceIps(), &out.SourceIPs},
		{"not_source_ips", m.GetNotSourceIps(), &out.NotSourceIPs},
		{"destination_ips", m.GetDestinationIps(), &out.DestinationIPs},
		{"not_destination_ips", m.GetNotDestinationIps(), &out.NotDestinationIPs},
	} {
		if *f.out, err = pbPrefixes(f.in); err != nil {
			return fmt.Errorf("%s%w", f.name, err)
		}
	}
	if out.DestinationPorts, err = pbPorts(m.GetDestinationPorts()); err != nil {
		return fmt.Errorf("destination_ports%w", err)
	}
	if out.NotDestinationPorts, err = pbPorts(m.GetNotDestinationPorts()); err != nil {
		return fmt.Errorf("not_destination_ports%w", err)
	}
	out.ServiceAccounts = pbServiceAccounts(m.GetServiceAccounts())
	out.NotServiceAccounts = pbServiceAccounts(m.GetNotServiceAccounts())
	return nil
}

// pbStringMatches converts a list; its errors start with "[i]".
func pbStringMatches(in []*security.StringMatch) ([]rbac.StringMatch, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]rbac.StringMatch, len(in))
	for i, sm := range in {
		switch t := sm.GetMatchType().(type) {
		case *security.StringMatch_Exact:
			out[i] = rbac.StringMatch{Kind: rbac.Exact, Value: t.Exact}
		case *security.StringMatch_Prefix:
			out[i] = rbac.StringMatch{Kind: rbac.Prefix, Value: t.Prefix}
		case *security.StringMatch_Suffix:
			out[i] = rbac.StringMatch{Kind: rbac.Suffix, Value: t.Suffix}
		case *security.StringMatch_Presence:
			out[i] = rbac.StringMatch{Kind: rbac.Presence}
		default:
			// ztunnel drops such an entry, which can widen a positive list
			// to "anything"; we reject the policy instead.
			return nil, fmt.Errorf("[%d]: string match without exact, prefix, suffix or presence", i)
		}
	}
	return out, nil
}

// pbPrefixes converts CIDRs; IPv4-mapped IPv6 prefixes of length ≥ 96 become
// IPv4 prefixes, so that they match the unmapped addresses the data path
// sees. Its errors start with "[i]".
func pbPrefixes(in []*security.Address) ([]netip.Prefix, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, len(in))
	for i, a := range in {
		ip, err := pbAddr(a.GetAddress())
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		bits := a.GetLength()
		if bits > uint32(ip.BitLen()) {
			return nil, fmt.Errorf("[%d]: prefix length %d longer than %v", i, bits, ip)
		}
		if ip.Is4In6() && bits >= 96 {
			ip, bits = ip.Unmap(), bits-96
		}
		out[i] = netip.PrefixFrom(ip, int(bits))
	}
	return out, nil
}

// pbPorts converts ports; its errors start with "[i]".
func pbPorts(in []uint32) ([]uint16, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]uint16, len(in))
	for i, p := range in {
		v, err := pbPort(p)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}

func pbServiceAccounts(in []*security.ServiceAccountMatch) []rbac.ServiceAccountMatch {
	if len(in) == 0 {
		return nil
	}
	out := make([]rbac.ServiceAccountMatch, len(in))
	for i, sa := range in {
		out[i] = rbac.ServiceAccountMatch{Namespace: sa.GetNamespace(), ServiceAccount: sa.GetServiceAccount()}
	}
	return out
}
