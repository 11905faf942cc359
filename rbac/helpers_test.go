package rbac_test

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
)

// fakeSource is a map-backed rbac.Source. Policies are indexed by scope in
// the order they were added, the way state indexes them.
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

// setSource is a fakeSource that also serves its scope lists as rbac.Sets,
// the way state serves them, so that Evaluate uses the Sets' indexes.
type setSource struct {
	*fakeSource
	byNS   map[string]*rbac.Set
	global *rbac.Set
}

var _ rbac.SetSource = (*setSource)(nil)

// indexed returns s served through rbac.Sets that are indexed however
// small. Later changes to s are not seen.
func (s *fakeSource) indexed() *setSource { return s.sets(rbac.NewIndexedSetForTest) }

// throughNewSetFrom returns s served through rbac.Sets built by NewSetFrom
// with no previous Set, which leaves small ones unindexed.
func (s *fakeSource) throughNewSetFrom() *setSource {
	return s.sets(func(ps []*rbac.Policy) *rbac.Set { return rbac.NewSetFrom(nil, ps) })
}

// indexedFrom is indexed, but builds each Set with NewSetFrom from a Set of
// a shuffled subset of the list and the extra policies, so that the
// analysis of some policies is reused and that of others is not.
func (s *fakeSource) indexedFrom(r *rand.Rand, extra []*rbac.Policy) *setSource {
	return s.sets(func(ps []*rbac.Policy) *rbac.Set {
		var prev []*rbac.Policy
		for _, p := range ps {
			if r.IntN(3) != 0 {
				prev = append(prev, p)
			}
		}
		prev = append(prev, extra...)
		r.Shuffle(len(prev), func(i, j int) { prev[i], prev[j] = prev[j], prev[i] })
		return rbac.NewIndexedSetFromForTest(rbac.NewIndexedSetForTest(prev), ps)
	})
}

func (s *fakeSource) sets(newSet func([]*rbac.Policy) *rbac.Set) *setSource {
	is := &setSource{fakeSource: s, byNS: map[string]*rbac.Set{}, global: newSet(s.global)}
	for ns, ps := range s.byNS {
		is.byNS[ns] = newSet(ps)
	}
	return is
}

func (s *setSource) NamespaceSet(ns string) *rbac.Set { return s.byNS[ns] }
func (s *setSource) GlobalSet() *rbac.Set             { return s.global }

// evaluate returns rbac.Evaluate's decision on src walked linearly, and
// fails tb if the decision through src's Sets differs in anything.
func evaluate(tb testing.TB, src *fakeSource, t rbac.Target, c rbac.Conn) rbac.Decision {
	tb.Helper()
	d := rbac.Evaluate(src, t, c)
	for _, is := range []*setSource{src.indexed(), src.throughNewSetFrom()} {
		if di := rbac.Evaluate(is, t, c); di != d {
			tb.Errorf("Evaluate(%+v, %+v): linear %v (%+v), through Sets %v (%+v)", t, c, d, d, di, di)
		}
	}
	return d
}
