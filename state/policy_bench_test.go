package state

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gozt/gozt/rbac"
)

// benchPolicySet returns n policies named p00000... in the namespaces that
// ns(i) picks, with the scope that scope(i) picks, in a scrambled (not
// sorted) order, as xDS delivers them.
func benchPolicySet(n int, ns func(i int) string, scope func(i int) rbac.Scope) []*rbac.Policy {
	ps := make([]*rbac.Policy, n)
	for i := range ps {
		j := (i * 7919) % n // 7919 is prime, so this visits every index once
		ps[i] = policy(ns(j), fmt.Sprintf("p%05d", j), scope(j))
	}
	return ps
}

// meshPolicySet returns n policies of `gozt bench`'s RBAC scenario (the
// shape of bench/mesh.go benchPolicies: two rules, a principal AND ports,
// a namespace prefix AND a /24), namespace-scoped in "bench", in a
// scrambled order.
func meshPolicySet(n int) []*rbac.Policy {
	ps := benchPolicySet(n, oneNamespace, namespaceScope)
	for _, p := range ps {
		var i int
		fmt.Sscanf(p.Name, "p%d", &i)
		p.Action = rbac.Action(i % 2)
		p.Rules = []rbac.Rule{
			{Clauses: []rbac.Clause{
				{Matches: []rbac.Match{{Principals: []rbac.StringMatch{{Kind: rbac.Exact, Value: fmt.Sprintf("cluster.local/ns/team-%d/sa/web", i)}}}}},
				{Matches: []rbac.Match{{DestinationPorts: []uint16{8080, 9090}}}},
			}},
			{Clauses: []rbac.Clause{{Matches: []rbac.Match{{
				Namespaces: []rbac.StringMatch{{Kind: rbac.Prefix, Value: fmt.Sprintf("team-%d", i)}},
				SourceIPs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24)},
			}}}}},
		}
	}
	return ps
}

func oneNamespace(int) string        { return "bench" }
func namespaceScope(int) rbac.Scope  { return rbac.Namespace }
func hundredNamespaces(i int) string { return fmt.Sprintf("ns%02d", i%100) }
func mixedScope(i int) rbac.Scope    { return rbac.Scope(i % 3) }
func globalScope(int) rbac.Scope     { return rbac.Global }
func storeAt(snap *Snapshot) *Store  { s := &Store{}; s.cur.Store(snap); return s }
func insertAll(b *Batch, ps []*rbac.Policy) error {
	for _, p := range ps {
		if err := b.InsertPolicy(p); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkInsertPolicies10k inserts 10,000 policies in one batch into an
// empty store: the `gozt bench` RBAC scenario's initial load (one
// namespace), and spreads over namespaces and scopes. Each batch's index
// work must be O(n log n), not a copy and sort of a namespace's list per
// insert.
func BenchmarkInsertPolicies10k(b *testing.B) {
	for _, tc := range []struct {
		name string
		ps   []*rbac.Policy
	}{
		{"one-namespace", benchPolicySet(10000, oneNamespace, namespaceScope)},
		{"100-namespaces-mixed-scope", benchPolicySet(10000, hundredNamespaces, mixedScope)},
		{"global", benchPolicySet(10000, oneNamespace, globalScope)},
		{"one-namespace-mesh-rules", meshPolicySet(10000)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				st := NewStore(Config{})
				var err error
				st.Update(func(bt *Batch) { err = insertAll(bt, tc.ps) })
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRemovePolicies10k removes, in one batch, all 10,000
// namespace-scoped policies of one namespace.
func BenchmarkRemovePolicies10k(b *testing.B) {
	ps := benchPolicySet(10000, oneNamespace, namespaceScope)
	full := NewStore(Config{})
	full.Update(func(bt *Batch) { _ = insertAll(bt, ps) })
	base := full.Snapshot()
	b.ReportAllocs()
	for b.Loop() {
		st := storeAt(base)
		st.Update(func(bt *Batch) {
			for _, p := range ps {
				if !bt.RemovePolicy(p.Key()) {
					b.Fatal("policy missing")
				}
			}
		})
		if len(st.Snapshot().NamespacePolicies("bench")) != 0 {
			b.Fatal("policies left")
		}
	}
}

// BenchmarkInsertOnePolicyOf10k replaces one policy in a namespace holding
// 10,000: the steady-state xDS push, which must stay O(n) (one copy of the
// namespace's list).
func BenchmarkInsertOnePolicyOf10k(b *testing.B) {
	for _, tc := range []struct {
		name string
		ps   []*rbac.Policy
	}{
		{"no-rules", benchPolicySet(10000, oneNamespace, namespaceScope)},
		{"mesh-rules", meshPolicySet(10000)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			full := NewStore(Config{})
			full.Update(func(bt *Batch) { _ = insertAll(bt, tc.ps) })
			base := full.Snapshot()
			p := *base.Policy("bench/p05000")
			b.ReportAllocs()
			for b.Loop() {
				st := storeAt(base)
				st.Update(func(bt *Batch) { _ = bt.InsertPolicy(&p) })
			}
		})
	}
}
