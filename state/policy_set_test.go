package state

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
)

// linearView hides a Snapshot's rbac.Sets, so that rbac.Evaluate matches
// every policy of its lists: the plain truth the Sets' indexes must agree
// with.
type linearView struct{ s *Snapshot }

func (v linearView) NamespacePolicies(ns string) []*rbac.Policy { return v.s.NamespacePolicies(ns) }
func (v linearView) GlobalPolicies() []*rbac.Policy             { return v.s.GlobalPolicies() }
func (v linearView) Policy(key string) *rbac.Policy             { return v.s.Policy(key) }

// rulePolicy returns a validated policy with one random rule of keyable and
// unkeyable shapes over small value pools.
func rulePolicy(rng *rand.Rand, ns, name string, scope rbac.Scope) *rbac.Policy {
	p := policy(ns, name, scope)
	p.Action = rbac.Action(rng.IntN(2))
	p.DryRun = rng.IntN(10) == 0
	var m rbac.Match
	switch rng.IntN(6) {
	case 0:
		m.Principals = []rbac.StringMatch{{Kind: rbac.Exact, Value: "td/ns/" + []string{"a", "b"}[rng.IntN(2)] + "/sa/x"}}
	case 1:
		m.Namespaces = []rbac.StringMatch{{Kind: rbac.Prefix, Value: []string{"", "a", "b"}[rng.IntN(3)]}}
	case 2:
		m.SourceIPs = []netip.Prefix{netip.MustParsePrefix([]string{"10.0.0.0/8", "10.0.0.1/32", "::/0"}[rng.IntN(3)])}
	case 3:
		m.DestinationPorts = []uint16{uint16(80 + rng.IntN(2))}
	case 4:
		m.NotPrincipals = []rbac.StringMatch{{Kind: rbac.Presence}}
	}
	p.Rules = []rbac.Rule{{Clauses: []rbac.Clause{{Matches: []rbac.Match{m}}}}}
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

func randomConn(rng *rand.Rand) rbac.Conn {
	c := rbac.Conn{
		Src: netip.AddrPortFrom(netip.MustParseAddr([]string{"10.0.0.1", "10.1.1.1", "::ffff:10.0.0.1", "2001:db8::1"}[rng.IntN(4)]), 1),
		Dst: netip.AddrPortFrom(netip.MustParseAddr("10.2.0.1"), uint16(80+rng.IntN(2))),
	}
	if rng.IntN(4) != 0 {
		c.Identity = identity.Identity{TrustDomain: "td", Namespace: []string{"a", "b"}[rng.IntN(2)], ServiceAccount: "x"}
	}
	return c
}

// TestSnapshotSetsDecideAsLinear drives the store with random policy
// batches and checks, after every batch, that each list's Set holds exactly
// that list, and that rbac.Evaluate through the snapshot's Sets decides as
// the linear walk of its lists; at the end, that no published snapshot's
// decisions changed.
func TestSnapshotSetsDecideAsLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 15008))
	namespaces := []string{"a", "b"}
	st := NewStore(Config{})
	type check struct {
		snap   *Snapshot
		target rbac.Target
		c      rbac.Conn
		want   rbac.Decision
	}
	var checks []check
	for batch := range 300 {
		st.Update(func(b *Batch) {
			for range rng.IntN(20) {
				ns, name := namespaces[rng.IntN(2)], fmt.Sprintf("p%d", rng.IntN(12))
				switch r := rng.IntN(20); {
				case r == 0:
					b.Reset()
				case r < 5:
					b.RemovePolicy(ns + "/" + name)
				default:
					if err := b.InsertPolicy(rulePolicy(rng, ns, name, rbac.Scope(rng.IntN(3)))); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
		snap := st.Snapshot()
		if !slices.Equal(snap.GlobalSet().Policies(), snap.GlobalPolicies()) {
			t.Fatalf("batch %d: GlobalSet and GlobalPolicies differ", batch)
		}
		for _, ns := range namespaces {
			if !slices.Equal(snap.NamespaceSet(ns).Policies(), snap.NamespacePolicies(ns)) {
				t.Fatalf("batch %d: NamespaceSet(%s) and NamespacePolicies differ", batch, ns)
			}
			target := rbac.Target{Namespace: ns}
			for _, p := range snap.Policies() {
				if rng.IntN(3) == 0 {
					target.PolicyRefs = append(target.PolicyRefs, p.Key())
				}
			}
			for range 10 {
				c := randomConn(rng)
				got, want := rbac.Evaluate(snap, target, c), rbac.Evaluate(linearView{snap}, target, c)
				if got != want {
					t.Fatalf("batch %d: Evaluate(%+v, %+v) through Sets = %v, linear %v", batch, target, c, got, want)
				}
				checks = append(checks, check{snap, target, c, got})
			}
		}
	}
	for _, ch := range checks {
		if got := rbac.Evaluate(ch.snap, ch.target, ch.c); got != ch.want {
			t.Fatalf("generation %d: decision changed after publication: %v, was %v", ch.snap.Generation(), got, ch.want)
		}
	}
}

// TestPolicySetsRebuiltOnlyWhenChanged: a batch rebuilds the Set of each
// list it changes, and no other; removing a policy and putting the same
// one back keeps the Set.
func TestPolicySetsRebuiltOnlyWhenChanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		for i := range 20 {
			must(b.InsertPolicy(rulePolicy(rng, "a", fmt.Sprintf("p%d", i), rbac.Namespace)))
			must(b.InsertPolicy(rulePolicy(rng, "b", fmt.Sprintf("p%d", i), rbac.Namespace)))
			must(b.InsertPolicy(rulePolicy(rng, "g", fmt.Sprintf("p%d", i), rbac.Global)))
		}
	})
	before := st.Snapshot()
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertPolicy(rulePolicy(rng, "a", "p3", rbac.Namespace)))
		p := before.Policy("b/p4")
		b.RemovePolicy(p.Key())
		must(b.InsertPolicy(p))
	})
	after := st.Snapshot()
	if after.NamespaceSet("a") == before.NamespaceSet("a") {
		t.Error("namespace a changed but kept its Set")
	}
	if after.NamespaceSet("b") != before.NamespaceSet("b") {
		t.Error("namespace b got the same list back but a new Set")
	}
	if after.GlobalSet() != before.GlobalSet() {
		t.Error("the global list did not change but got a new Set")
	}
}

// TestEvaluateSnapshotDoesNotAllocate: a decision through a snapshot's
// indexed Sets allocates nothing (STYLE rule 38).
func TestEvaluateSnapshotDoesNotAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		for i := range 200 {
			must(b.InsertPolicy(rulePolicy(rng, "a", fmt.Sprintf("p%d", i), rbac.Scope(i%2))))
		}
	})
	snap := st.Snapshot()
	for range 20 {
		c := randomConn(rng)
		target := rbac.Target{Namespace: "a", PolicyRefs: []string{"a/p1", "a/p2"}}
		if n := testing.AllocsPerRun(50, func() { rbac.Evaluate(snap, target, c) }); n != 0 {
			t.Errorf("Evaluate(%+v): %v allocs per run, want 0", c, n)
		}
	}
}
