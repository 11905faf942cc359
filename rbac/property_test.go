package rbac_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
)

// This file checks Evaluate against refEvaluate, a deliberately plain
// evaluator written from SPEC §4.2–4.3 and the package documentation: it
// builds the principal string, collects the applicable policies into a
// slice, compares CIDRs bit by bit on 16-byte addresses, and allocates as it
// likes. The two share no matching code.

// refApplicable returns the applicable policies in evaluation order (each
// once) and the unknown referenced keys.
func refApplicable(src rbac.Source, t rbac.Target) (ps []*rbac.Policy, unknown []string) {
	seen := map[*rbac.Policy]bool{}
	add := func(p *rbac.Policy) {
		if !seen[p] {
			seen[p] = true
			ps = append(ps, p)
		}
	}
	for _, p := range src.NamespacePolicies(t.Namespace) {
		add(p)
	}
	for _, p := range src.GlobalPolicies() {
		add(p)
	}
	for _, k := range t.PolicyRefs {
		if p := src.Policy(k); p != nil {
			add(p)
		} else {
			unknown = append(unknown, k)
		}
	}
	return ps, unknown
}

func refEvaluate(src rbac.Source, t rbac.Target, c rbac.Conn) rbac.Decision {
	ps, unknown := refApplicable(src, t)
	for _, p := range ps {
		if p.Action == rbac.Deny && !p.DryRun {
			if rule, f, ok := refPolicyMatch(p, c); ok {
				return rbac.Decision{Reason: rbac.DeniedByPolicy, Policy: p, Rule: rule, Match: f}
			}
		}
	}
	if len(unknown) > 0 {
		return rbac.Decision{Reason: rbac.DeniedUnknownPolicy, Rule: -1, Missing: unknown[0]}
	}
	anyAllow := false
	for _, p := range ps {
		if p.Action == rbac.Allow && !p.DryRun {
			anyAllow = true
			if rule, f, ok := refPolicyMatch(p, c); ok {
				return rbac.Decision{Allow: true, Reason: rbac.AllowedByPolicy, Policy: p, Rule: rule, Match: f}
			}
		}
	}
	if anyAllow {
		return rbac.Decision{Reason: rbac.DeniedNoAllowMatched, Rule: -1}
	}
	return rbac.Decision{Allow: true, Reason: rbac.AllowedNoPolicies, Rule: -1}
}

// refPolicyMatch returns the first matching rule and the fields of the
// first holding Match of each of its clauses.
func refPolicyMatch(p *rbac.Policy, c rbac.Conn) (int, rbac.Fields, bool) {
	for ri, r := range p.Rules {
		var f rbac.Fields
		ruleOK := true
		for _, cl := range r.Clauses {
			clauseOK := len(cl.Matches) == 0
			for _, m := range cl.Matches {
				holds, fields := refMatch(m, c)
				if fields == 0 { // every field empty
					if p.Action != rbac.Deny {
						continue
					}
					holds, fields = true, rbac.FieldEmptyMatch
				}
				if holds {
					clauseOK = true
					f |= fields
					break
				}
			}
			if !clauseOK {
				ruleOK = false
				break
			}
		}
		if ruleOK {
			return ri, f, true
		}
	}
	return -1, 0, false
}

// refMatch reports whether every non-empty field of m holds, and which
// fields are non-empty.
func refMatch(m rbac.Match, c rbac.Conn) (bool, rbac.Fields) {
	id := c.Identity
	hasID := id != identity.Identity{}
	principal := ""
	if hasID {
		principal = fmt.Sprintf("%s/ns/%s/sa/%s", id.TrustDomain, id.Namespace, id.ServiceAccount)
	}
	principalIn := func(ms []rbac.StringMatch) bool {
		return hasID && slices.ContainsFunc(ms, func(sm rbac.StringMatch) bool { return refString(sm, principal) })
	}
	nsIn := func(ms []rbac.StringMatch) bool {
		return slices.ContainsFunc(ms, func(sm rbac.StringMatch) bool { return refString(sm, id.Namespace) })
	}
	saIn := func(ms []rbac.ServiceAccountMatch) bool {
		return hasID && slices.Contains(ms, rbac.ServiceAccountMatch{Namespace: id.Namespace, ServiceAccount: id.ServiceAccount})
	}
	ipIn := func(ps []netip.Prefix, a netip.Addr) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return refContains(p, a) })
	}
	checks := []struct {
		nonEmpty bool
		holds    func() bool
		field    rbac.Fields
	}{
		{len(m.Namespaces) > 0, func() bool { return nsIn(m.Namespaces) }, rbac.FieldNamespaces},
		{len(m.NotNamespaces) > 0, func() bool { return !nsIn(m.NotNamespaces) }, rbac.FieldNotNamespaces},
		{len(m.Principals) > 0, func() bool { return principalIn(m.Principals) }, rbac.FieldPrincipals},
		{len(m.NotPrincipals) > 0, func() bool { return !principalIn(m.NotPrincipals) }, rbac.FieldNotPrincipals},
		{len(m.SourceIPs) > 0, func() bool { return ipIn(m.SourceIPs, c.Src.Addr()) }, rbac.FieldSourceIPs},
		{len(m.NotSourceIPs) > 0, func() bool { return !ipIn(m.NotSourceIPs, c.Src.Addr()) }, rbac.FieldNotSourceIPs},
		{len(m.DestinationIPs) > 0, func() bool { return ipIn(m.DestinationIPs, c.Dst.Addr()) }, rbac.FieldDestinationIPs},
		{len(m.NotDestinationIPs) > 0, func() bool { return !ipIn(m.NotDestinationIPs, c.Dst.Addr()) }, rbac.FieldNotDestinationIPs},
		{len(m.DestinationPorts) > 0, func() bool { return slices.Contains(m.DestinationPorts, c.Dst.Port()) }, rbac.FieldDestinationPorts},
		{len(m.NotDestinationPorts) > 0, func() bool { return !slices.Contains(m.NotDestinationPorts, c.Dst.Port()) }, rbac.FieldNotDestinationPorts},
		{len(m.ServiceAccounts) > 0, func() bool { return saIn(m.ServiceAccounts) }, rbac.FieldServiceAccounts},
		{len(m.NotServiceAccounts) > 0, func() bool { return !saIn(m.NotServiceAccounts) }, rbac.FieldNotServiceAccounts},
	}
	holds, fields := true, rbac.Fields(0)
	for _, ch := range checks {
		if ch.nonEmpty {
			fields |= ch.field
			holds = holds && ch.holds()
		}
	}
	return holds, fields
}

func refString(sm rbac.StringMatch, v string) bool {
	switch sm.Kind {
	case rbac.Exact:
		return v == sm.Value
	case rbac.Prefix:
		return strings.HasPrefix(v, sm.Value)
	case rbac.Suffix:
		return strings.HasSuffix(v, sm.Value)
	case rbac.Presence:
		return v != ""
	}
	return false
}

// refContains compares in the 16-byte IPv6 space, where IPv4 lives at
// ::ffff:0:0/96, and then requires both sides to be in the same family:
// an IPv4 (or mapped) address only in a prefix that lies inside
// ::ffff:0:0/96 (an IPv4 prefix, or a mapped one of length ≥ 96).
func refContains(p netip.Prefix, a netip.Addr) bool {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	pa, aa := p.Addr().As16(), a.As16()
	v4Prefix := bits >= 96 && [12]byte(pa[:12]) == [12]byte{10: 0xff, 11: 0xff}
	v4Addr := [12]byte(aa[:12]) == [12]byte{10: 0xff, 11: 0xff}
	if v4Prefix != v4Addr {
		return false
	}
	for i := range bits {
		mask := byte(0x80 >> (i % 8))
		if pa[i/8]&mask != aa[i/8]&mask {
			return false
		}
	}
	return true
}

// gen draws random policy sets and connections from small pools, so that
// matches are frequent and boundary values (metacharacters, prefixes that
// cross the principal's pieces, mapped addresses) come up often.
type gen struct{ r *rand.Rand }

var (
	genNamespaces = []string{"a", "b", "ns.a", "nsXa", "istio-system"}
	genStrings    = []string{"a", "b", "ns.a", "nsXa", "", "ns", ".a", "Xa", "cluster.local/ns/a/sa/x",
		"cluster.local/ns/ns.a/sa/x", "cluster.local/ns/", "cluster.local/ns/a", "/sa/x", "sa/y", "other.td/ns/b/sa/y",
		"x", "y", "*", "a/sa/x"}
	genPrefixes = []string{"10.0.0.0/8", "10.0.0.0/24", "10.0.0.1/32", "192.168.0.0/16", "0.0.0.0/0",
		"2001:db8::/32", "2001:db8::/48", "::/0", "::ffff:10.0.0.0/104", "::ffff:0.0.0.0/95", "fe80::/10"}
	genAddrs = []string{"10.0.0.1", "10.0.1.1", "192.168.1.1", "2001:db8::1", "2001:db8:1::1",
		"::ffff:10.0.0.1", "fe80::1%eth0", "11.1.1.1"}
	genPorts = []uint16{80, 8080, 9090, 15008}
)

func pick[T any](g gen, xs []T) T { return xs[g.r.IntN(len(xs))] }

func some[T any](g gen, f func() T) []T {
	if g.r.IntN(6) != 0 {
		return nil
	}
	out := make([]T, 1+g.r.IntN(3))
	for i := range out {
		out[i] = f()
	}
	return out
}

func (g gen) stringMatch() rbac.StringMatch {
	k := rbac.MatchKind(g.r.IntN(4))
	if k == rbac.Presence {
		return rbac.StringMatch{Kind: k}
	}
	return rbac.StringMatch{Kind: k, Value: pick(g, genStrings)}
}

func (g gen) match() rbac.Match {
	if g.r.IntN(8) == 0 {
		return rbac.Match{}
	}
	prefixes := func() netip.Prefix { return netip.MustParsePrefix(pick(g, genPrefixes)) }
	sam := func() rbac.ServiceAccountMatch {
		return rbac.ServiceAccountMatch{Namespace: pick(g, genNamespaces), ServiceAccount: pick(g, []string{"x", "y"})}
	}
	port := func() uint16 { return pick(g, genPorts) }
	return rbac.Match{
		Namespaces: some(g, g.stringMatch), NotNamespaces: some(g, g.stringMatch),
		Principals: some(g, g.stringMatch), NotPrincipals: some(g, g.stringMatch),
		SourceIPs: some(g, prefixes), NotSourceIPs: some(g, prefixes),
		DestinationIPs: some(g, prefixes), NotDestinationIPs: some(g, prefixes),
		DestinationPorts: some(g, port), NotDestinationPorts: some(g, port),
		ServiceAccounts: some(g, sam), NotServiceAccounts: some(g, sam),
	}
}

func (g gen) policy(name string) *rbac.Policy {
	p := &rbac.Policy{
		Name:      name,
		Namespace: pick(g, []string{"a", "b", "istio-system"}),
		Scope:     rbac.Scope(g.r.IntN(3)),
		Action:    rbac.Action(g.r.IntN(2)),
		DryRun:    g.r.IntN(5) == 0,
	}
	p.Rules = randomRules(g.r, 3, g.match)
	return p
}

// randomRules returns up to 3 rules of up to maxClauses-1 clauses of up to
// 2 matches each, made by match.
func randomRules(r *rand.Rand, maxClauses int, match func() rbac.Match) []rbac.Rule {
	var rules []rbac.Rule
	for range r.IntN(4) {
		var rl rbac.Rule
		for range r.IntN(maxClauses) {
			var c rbac.Clause
			for range r.IntN(3) {
				c.Matches = append(c.Matches, match())
			}
			rl.Clauses = append(rl.Clauses, c)
		}
		rules = append(rules, rl)
	}
	return rules
}

func (g gen) conn() rbac.Conn {
	c := rbac.Conn{
		Src: netip.AddrPortFrom(netip.MustParseAddr(pick(g, genAddrs)), 40000),
		Dst: netip.AddrPortFrom(netip.MustParseAddr(pick(g, genAddrs)), pick(g, genPorts)),
	}
	if g.r.IntN(4) != 0 {
		c.Identity = identity.Identity{
			TrustDomain:    pick(g, []string{"cluster.local", "other.td"}),
			Namespace:      pick(g, genNamespaces),
			ServiceAccount: pick(g, []string{"x", "y"}),
		}
	}
	return c
}

// scenario draws a policy set and a target that references some of its
// policies (of any scope), sometimes twice, sometimes a key that is unknown.
func (g gen) scenario() (*fakeSource, rbac.Target) {
	src := newFakeSource()
	var keys []string
	for i := range g.r.IntN(10) {
		p := g.policy(fmt.Sprintf("p%d", i))
		src.add(p)
		keys = append(keys, p.Key())
	}
	t := rbac.Target{Namespace: pick(g, []string{"a", "b"})}
	for _, k := range keys {
		if g.r.IntN(3) == 0 {
			t.PolicyRefs = append(t.PolicyRefs, k)
		}
	}
	if len(keys) > 0 && g.r.IntN(10) == 0 {
		t.PolicyRefs = append(t.PolicyRefs, pick(g, keys))
	}
	if g.r.IntN(15) == 0 {
		t.PolicyRefs = append(t.PolicyRefs, "a/never-sent")
	}
	return src, t
}

var propertySeeds = []uint64{1, 2, 3, 0x5eed}

const scenariosPerSeed = 2000

func TestEvaluateMatchesReference(t *testing.T) {
	reasons := map[rbac.Reason]int{}
	for _, seed := range propertySeeds {
		g := gen{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
		for i := range scenariosPerSeed {
			src, target := g.scenario()
			indexed, throughNewSetFrom := src.indexed(), src.throughNewSetFrom()
			for range 8 {
				c := g.conn()
				want := refEvaluate(src, target, c)
				for _, s := range []rbac.Source{src, indexed, throughNewSetFrom} {
					got := rbac.Evaluate(s, target, c)
					if got.Policy != want.Policy ||
						!cmp.Equal(want, got, cmpopts.IgnoreFields(rbac.Decision{}, "Policy")) {
						t.Fatalf("seed %d scenario %d: Evaluate(%T, %+v, %+v) = %v (%+v), reference = %v (%+v)",
							seed, i, s, target, c, got, got, want, want)
					}
					if e := rbac.Explain(s, target, c); e.Decision != got || explainDecides(e) != got.Reason {
						t.Fatalf("seed %d scenario %d: Explain(%T) disagrees: %+v, Evaluate = %v", seed, i, s, e, got)
					}
				}
				reasons[want.Reason]++
			}
		}
	}
	// The generator must exercise every outcome, or the test proves little.
	for r := rbac.AllowedNoPolicies; r <= rbac.DeniedUnknownPolicy; r++ {
		if reasons[r] < 100 {
			t.Errorf("only %d decisions with reason %v; make the generator hit it more", reasons[r], r)
		}
	}
	t.Logf("decisions by reason: %v", reasons)
}

// explainDecides derives the reason from Explain's per-policy outcomes alone.
func explainDecides(e rbac.Explanation) rbac.Reason {
	for _, p := range e.Policies {
		if p.Action == "Deny" && !p.DryRun && p.Matched {
			return rbac.DeniedByPolicy
		}
	}
	if len(e.UnknownRefs) > 0 {
		return rbac.DeniedUnknownPolicy
	}
	anyAllow := false
	for _, p := range e.Policies {
		if p.Action == "Allow" && !p.DryRun {
			anyAllow = true
			if p.Matched {
				return rbac.AllowedByPolicy
			}
		}
	}
	if anyAllow {
		return rbac.DeniedNoAllowMatched
	}
	return rbac.AllowedNoPolicies
}

// TestAddingDenyNeverAllowsMore: for random policy sets, adding an enforced
// DENY policy (of any scope, referenced when selector-scoped) never turns a
// denied connection into an allowed one; adding a dry-run policy of either
// action changes no decision (TESTPLAN S1).
func TestAddingDenyNeverAllowsMore(t *testing.T) {
	var narrowed int // decisions the extra DENY changed to deny
	for _, seed := range propertySeeds {
		g := gen{rand.New(rand.NewPCG(seed, 42))}
		for i := range scenariosPerSeed {
			src, target := g.scenario()
			extra := g.policy("extra")
			if !extra.DryRun {
				extra.Action = rbac.Deny
			}
			withExtra := src.clone()
			withExtra.add(extra)
			extraTarget := target
			if extra.Scope == rbac.WorkloadSelector {
				extraTarget.PolicyRefs = append(slices.Clone(target.PolicyRefs), extra.Key())
			}
			for range 8 {
				c := g.conn()
				before, after := rbac.Evaluate(src, target, c), rbac.Evaluate(withExtra, extraTarget, c)
				switch {
				case extra.DryRun && before != after:
					t.Fatalf("seed %d scenario %d: dry-run %+v changed %v to %v", seed, i, extra, before, after)
				case extra.Action == rbac.Deny && after.Allow && !before.Allow:
					t.Fatalf("seed %d scenario %d: adding DENY %+v allowed %+v: %v, was %v", seed, i, extra, c, after, before)
				case before.Allow && !after.Allow:
					narrowed++
				}
			}
		}
	}
	if narrowed < 1000 {
		t.Errorf("the extra DENY narrowed only %d decisions; the property is barely exercised", narrowed)
	}
	t.Logf("the extra DENY narrowed %d decisions", narrowed)
}
