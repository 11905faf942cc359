package rbac

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Validate checks a policy built from configuration or xDS and returns an
// error naming the policy and the first problem found, or nil. It rejects
// what the evaluator could only guess at: an unknown Action, Scope or
// StringMatch kind, a presence match with a value, an invalid CIDR, and a
// missing name or namespace (or a namespace containing "/", which would make
// the key "namespace/name" ambiguous).
//
// It accepts what is odd but well defined, because istiod can send it:
// policies, rules, clauses or matches that are empty (their meaning is in the
// package documentation), port 0, empty string values, and CIDRs with host
// bits set (the host bits are ignored).
func (p *Policy) Validate() error {
	if p == nil {
		return errors.New("rbac: nil policy")
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("rbac: policy %q: %w", p.Key(), err)
	}
	return nil
}

func (p *Policy) validate() error {
	switch {
	case p.Name == "":
		return errors.New("empty name")
	case p.Namespace == "":
		return errors.New("empty namespace")
	case strings.Contains(p.Namespace, "/"):
		return errors.New("namespace contains '/'")
	}
	switch p.Scope {
	case Global, Namespace, WorkloadSelector:
	default:
		return fmt.Errorf("unknown scope %d", p.Scope)
	}
	switch p.Action {
	case Allow, Deny:
	default:
		return fmt.Errorf("unknown action %d", p.Action)
	}
	for ri := range p.Rules {
		for ci := range p.Rules[ri].Clauses {
			for mi := range p.Rules[ri].Clauses[ci].Matches {
				if err := p.Rules[ri].Clauses[ci].Matches[mi].validate(); err != nil {
					return fmt.Errorf("rule %d clause %d match %d: %w", ri, ci, mi, err)
				}
			}
		}
	}
	return nil
}

func (m *Match) validate() error {
	for _, l := range []struct {
		name string
		ms   []StringMatch
	}{
		{"namespaces", m.Namespaces},
		{"not_namespaces", m.NotNamespaces},
		{"principals", m.Principals},
		{"not_principals", m.NotPrincipals},
	} {
		for i := range l.ms {
			if err := l.ms[i].validate(); err != nil {
				return fmt.Errorf("%s[%d]: %w", l.name, i, err)
			}
		}
	}
	for _, l := range []struct {
		name string
		ps   []netip.Prefix
	}{
		{"source_ips", m.SourceIPs},
		{"not_source_ips", m.NotSourceIPs},
		{"destination_ips", m.DestinationIPs},
		{"not_destination_ips", m.NotDestinationIPs},
	} {
		for i, p := range l.ps {
			if !p.IsValid() {
				return fmt.Errorf("%s[%d]: invalid CIDR %v", l.name, i, p)
			}
		}
	}
	return nil
}

func (sm *StringMatch) validate() error {
	switch sm.Kind {
	case Exact, Prefix, Suffix:
		return nil
	case Presence:
		if sm.Value != "" {
			return fmt.Errorf("presence match has value %q", sm.Value)
		}
		return nil
	}
	return fmt.Errorf("unknown match kind %d", sm.Kind)
}
