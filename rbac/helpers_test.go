package rbac_test

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
)

// fakeSource is a map-backed rbac.Source. Policies are indexed by scope in
// the order they were added, the way proxy/state indexes them.
type fakeSource struct {
	byKey  map[string]*rbac.Policy
	byNS   map[string][]*rbac.Policy
	global []*rbac.Policy
}

var _ rbac.Source = (*fakeSource)(nil)

func newFakeSource(ps ...*rbac.Policy) *fakeSource {
	s := &fakeSource{byKey: map[string]*rbac.Policy{}, byNS: map[string][]*rbac.Policy{}}
	for _, p := range ps {
		s.add(p)
	}
	return s
}

func (s *fakeSource) add(p *rbac.Policy) {
	s.byKey[p.Key()] = p
	switch p.Scope {
	case rbac.Namespace:
		s.byNS[p.Namespace] = append(s.byNS[p.Namespace], p)
	case rbac.Global:
		s.global = append(s.global, p)
	}
}

// clone returns a copy that can be added to without changing s.
func (s *fakeSource) clone() *fakeSource {
	ns := make(map[string][]*rbac.Policy, len(s.byNS))
	for k, v := range s.byNS {
		ns[k] = slices.Clone(v)
	}
	return &fakeSource{byKey: maps.Clone(s.byKey), byNS: ns, global: slices.Clone(s.global)}
}

func (s *fakeSource) NamespacePolicies(ns string) []*rbac.Policy { return s.byNS[ns] }
func (s *fakeSource) GlobalPolicies() []*rbac.Policy             { return s.global }
func (s *fakeSource) Policy(key string) *rbac.Policy             { return s.byKey[key] }

// Connection defaults used by the tables.
const (
	clientID   = "spiffe://cluster.local/ns/client-ns/sa/client-sa"
	clientPrin = "cluster.local/ns/client-ns/sa/client-sa"
	srcDefault = "10.0.0.1:40000"
	dstDefault = "10.1.0.5:8080"
	targetNS   = "dst"
)

// conn builds a Conn; id "" means no identity.
func conn(tb testing.TB, src, dst, id string) rbac.Conn {
	tb.Helper()
	c := rbac.Conn{Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)}
	if id != "" {
		c.Identity = identity.MustParse(id)
	}
	return c
}

func defaultConn(tb testing.TB) rbac.Conn { return conn(tb, srcDefault, dstDefault, clientID) }

func policy(ns, name string, scope rbac.Scope, action rbac.Action, rules ...rbac.Rule) *rbac.Policy {
	return &rbac.Policy{Name: name, Namespace: ns, Scope: scope, Action: action, Rules: rules}
}

// oneMatch is a policy with one rule, one clause and the given match.
func oneMatch(action rbac.Action, m rbac.Match) *rbac.Policy {
	return policy(targetNS, "p", rbac.Namespace, action, rule(clause(m)))
}

func rule(cs ...rbac.Clause) rbac.Rule    { return rbac.Rule{Clauses: cs} }
func clause(ms ...rbac.Match) rbac.Clause { return rbac.Clause{Matches: ms} }

func exact(v string) rbac.StringMatch  { return rbac.StringMatch{Kind: rbac.Exact, Value: v} }
func prefix(v string) rbac.StringMatch { return rbac.StringMatch{Kind: rbac.Prefix, Value: v} }
func suffix(v string) rbac.StringMatch { return rbac.StringMatch{Kind: rbac.Suffix, Value: v} }
func presence() rbac.StringMatch       { return rbac.StringMatch{Kind: rbac.Presence} }

func sms(ms ...rbac.StringMatch) []rbac.StringMatch { return ms }

func cidrs(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func ports(ps ...uint16) []uint16 { return ps }

func sa(ns, name string) rbac.ServiceAccountMatch {
	return rbac.ServiceAccountMatch{Namespace: ns, ServiceAccount: name}
}

func sas(ms ...rbac.ServiceAccountMatch) []rbac.ServiceAccountMatch { return ms }

// realisticSource is a small cluster's policy set as istiod would send it,
// for the allocation test: policies of every scope and action, dry-run, a
// STRICT peer-authentication DENY, an L7-only DENY and a reference that
// duplicates a namespace-scoped policy. The target is a workload in "apps".
func realisticSource() (*fakeSource, rbac.Target) {
	src := newFakeSource(
		policy("istio-system", "deny-blocked", rbac.Global, rbac.Deny,
			rule(clause(rbac.Match{Namespaces: sms(exact("blocked"))}))),
		policy("istio-system", "istio_converted_static_strict", rbac.WorkloadSelector, rbac.Deny,
			rule(clause(rbac.Match{NotPrincipals: sms(presence())}))),
		policy("apps", "allow-frontend", rbac.Namespace, rbac.Allow,
			rule(clause(rbac.Match{Principals: sms(exact("cluster.local/ns/frontend/sa/web"))}),
				clause(rbac.Match{DestinationPorts: ports(8080)}))),
		policy("apps", "allow-monitoring", rbac.Namespace, rbac.Allow,
			rule(clause(rbac.Match{Namespaces: sms(prefix("monitoring")), SourceIPs: cidrs("10.10.0.0/16")}))),
		policy("apps", "deny-legacy", rbac.Namespace, rbac.Deny,
			rule(clause(rbac.Match{SourceIPs: cidrs("192.168.0.0/16", "2001:db8:dead::/48")}))),
		policy("apps", "allow-ops", rbac.WorkloadSelector, rbac.Allow,
			rule(clause(rbac.Match{Principals: sms(suffix("/sa/admin")), NotSourceIPs: cidrs("10.99.0.0/16")}),
				clause(rbac.Match{DestinationPorts: ports(8443, 9443)}))),
		&rbac.Policy{Name: "dry-run-deny-all", Namespace: "apps", Scope: rbac.WorkloadSelector,
			Action: rbac.Deny, DryRun: true, Rules: []rbac.Rule{rule()}},
		policy("apps", "l7-deny", rbac.WorkloadSelector, rbac.Deny,
			rule(clause(rbac.Match{Principals: sms(exact("cluster.local/ns/scanner/sa/bot"))}), clause(rbac.Match{}))),
		policy("other", "allow-nothing", rbac.Namespace, rbac.Allow),
	)
	return src, rbac.Target{Namespace: "apps", PolicyRefs: []string{
		"istio-system/istio_converted_static_strict", "apps/allow-ops", "apps/dry-run-deny-all",
		"apps/l7-deny", "apps/allow-frontend",
	}}
}
