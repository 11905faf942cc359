package rbac_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
)

// keyedGen draws policy sets shaped for the Sets' indexes: mostly Matches
// with keyable positive fields whose values are cut from the connections'
// own values (whole, or a random prefix or suffix, so that keys often hit
// and prefixes cross the principal's pieces), mixed with everything that
// makes a rule unkeyable (not_ fields, presence, empty matches, clauses
// without matches) and with gen's unbiased matches.
type keyedGen struct{ gen }

var (
	keyedIDs = []identity.Identity{
		{TrustDomain: "cluster.local", Namespace: "a", ServiceAccount: "x"},
		{TrustDomain: "cluster.local", Namespace: "ns.a", ServiceAccount: "y"},
		{TrustDomain: "other.td", Namespace: "nsXa", ServiceAccount: "x"},
		{TrustDomain: "cluster.local", Namespace: "", ServiceAccount: "x"}, // empty namespace
		{TrustDomain: "td", Namespace: "a-very-long-namespace-name", ServiceAccount: "sa"},
		{}, // no identity
	}
	keyedAddrs = []string{"10.0.0.1", "10.0.1.1", "10.200.3.4", "192.168.1.1", "0.0.0.1", "255.255.255.255",
		"2001:db8::1", "2001:db8:1::1", "::ffff:10.0.0.1", "fe80::1%eth0", "::1", "::"}
)

func (g keyedGen) identity() identity.Identity { return pick(g.gen, keyedIDs) }

// cut returns s whole, or a random prefix or suffix of it, as a
// StringMatch; sometimes a presence match.
func (g keyedGen) cut(s string) rbac.StringMatch {
	n := g.r.IntN(len(s) + 1)
	switch g.r.IntN(7) {
	case 0, 1:
		return rbac.StringMatch{Kind: rbac.Prefix, Value: s[:n]}
	case 2, 3:
		return rbac.StringMatch{Kind: rbac.Suffix, Value: s[len(s)-n:]}
	case 4:
		return rbac.StringMatch{Kind: rbac.Presence}
	}
	return rbac.StringMatch{Kind: rbac.Exact, Value: s}
}

// prefix returns a CIDR around one of the connections' addresses, of a
// random length, written as IPv4, IPv6 or IPv4-mapped IPv6, host bits
// sometimes left set.
func (g keyedGen) prefix() netip.Prefix {
	a := netip.MustParseAddr(pick(g.gen, keyedAddrs)).WithZone("")
	if a.Is4() && g.r.IntN(4) == 0 {
		a = netip.AddrFrom16(a.As16())
	}
	p := netip.PrefixFrom(a, g.r.IntN(a.BitLen()+1))
	if g.r.IntN(2) == 0 {
		p = p.Masked()
	}
	return p
}

func (g keyedGen) match() rbac.Match {
	switch g.r.IntN(12) {
	case 0:
		return rbac.Match{}
	case 1:
		return g.gen.match()
	}
	var m rbac.Match
	for range 1 + g.r.IntN(2) {
		id := g.identity()
		switch g.r.IntN(7) {
		case 0:
			m.Principals = append(m.Principals, g.cut(id.Principal()))
		case 1:
			m.Namespaces = append(m.Namespaces, g.cut(id.Namespace))
		case 2:
			m.ServiceAccounts = append(m.ServiceAccounts, rbac.ServiceAccountMatch{Namespace: id.Namespace, ServiceAccount: id.ServiceAccount})
		case 3:
			m.SourceIPs = append(m.SourceIPs, g.prefix())
		case 4:
			m.DestinationIPs = append(m.DestinationIPs, g.prefix())
		case 5:
			m.DestinationPorts = append(m.DestinationPorts, pick(g.gen, genPorts))
		case 6: // a negative field alone leaves the Match unkeyable
			m.NotPrincipals = append(m.NotPrincipals, g.cut(id.Principal()))
			m.NotSourceIPs = append(m.NotSourceIPs, g.prefix())
		}
	}
	return m
}

func (g keyedGen) policy(name string) *rbac.Policy {
	p := &rbac.Policy{
		Name:      name,
		Namespace: pick(g.gen, []string{"a", "b", "istio-system"}),
		Scope:     rbac.Scope(g.r.IntN(3)),
		DryRun:    g.r.IntN(8) == 0,
	}
	if g.r.IntN(4) == 0 { // DENY policies that match end the walk: keep them rarer
		p.Action = rbac.Deny
	}
	p.Rules = randomRules(g.r, 4, g.match)
	return p
}

func (g keyedGen) conn() rbac.Conn {
	return rbac.Conn{
		Src:      netip.AddrPortFrom(netip.MustParseAddr(pick(g.gen, keyedAddrs)), 40000),
		Dst:      netip.AddrPortFrom(netip.MustParseAddr(pick(g.gen, keyedAddrs)), pick(g.gen, genPorts)),
		Identity: g.identity(),
	}
}

func (g keyedGen) scenario() (*fakeSource, rbac.Target) {
	src := newFakeSource()
	var keys []string
	for i := range g.r.IntN(60) {
		p := g.policy(fmt.Sprintf("p%d", i))
		if err := p.Validate(); err != nil {
			panic(err)
		}
		src.add(p)
		keys = append(keys, p.Key())
	}
	t := rbac.Target{Namespace: pick(g.gen, []string{"a", "b"})}
	for _, k := range keys {
		if g.r.IntN(4) == 0 {
			t.PolicyRefs = append(t.PolicyRefs, k)
		}
	}
	if g.r.IntN(20) == 0 {
		t.PolicyRefs = append(t.PolicyRefs, "a/never-sent")
	}
	return src, t
}

// TestSetsMatchReference checks that Evaluate through rbac.Sets decides
// exactly as the reference evaluator (and the linear walk) on random policy
// sets built for the index: same reason, same deciding policy, rule and
// fields; that Sets built by NewSetFrom, reusing another Set's analysis,
// decide the same; and that Explain through the Sets agrees.
func TestSetsMatchReference(t *testing.T) {
	reasons := map[rbac.Reason]int{}
	for _, seed := range propertySeeds {
		g := keyedGen{gen{rand.New(rand.NewPCG(seed, 0x5e75))}}
		for i := range scenariosPerSeed {
			src, target := g.scenario()
			indexed := src.indexed()
			var extra []*rbac.Policy
			for j := range g.r.IntN(4) {
				extra = append(extra, g.policy(fmt.Sprintf("extra%d", j)))
			}
			reused := src.indexedFrom(g.r, extra)
			for range 16 {
				c := g.conn()
				want := refEvaluate(src, target, c)
				got := rbac.Evaluate(indexed, target, c)
				if got.Policy != want.Policy || !cmp.Equal(want, got, cmpopts.IgnoreFields(rbac.Decision{}, "Policy")) {
					t.Fatalf("seed %d scenario %d: Evaluate through Sets(%+v, %+v) = %v (%+v), reference = %v (%+v)",
						seed, i, target, c, got, got, want, want)
				}
				if r := rbac.Evaluate(reused, target, c); r != got {
					t.Fatalf("seed %d scenario %d: through Sets built from a previous Set %v, from none %v", seed, i, r, got)
				}
				if lin := rbac.Evaluate(src, target, c); lin != got {
					t.Fatalf("seed %d scenario %d: linear %v, through Sets %v", seed, i, lin, got)
				}
				if e := rbac.Explain(indexed, target, c); e.Decision != got || explainDecides(e) != got.Reason {
					t.Fatalf("seed %d scenario %d: Explain disagrees: %+v, Evaluate = %v", seed, i, e, got)
				}
				reasons[got.Reason]++
			}
		}
	}
	for r := rbac.AllowedNoPolicies; r <= rbac.DeniedUnknownPolicy; r++ {
		if reasons[r] < 100 {
			t.Errorf("only %d decisions with reason %v; make the generator hit it more", reasons[r], r)
		}
	}
	t.Logf("decisions by reason: %v", reasons)
}
