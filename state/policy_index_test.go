package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/rbac"
)

// policyModel is the plain truth the policy indexes must match: the
// policies by key.
type policyModel map[string]*rbac.Policy

// wantIndex returns what NamespacePolicies(ns) (or GlobalPolicies, for
// ns "") must hold: the model's policies of that scope, sorted by key.
func (m policyModel) wantIndex(ns string) []*rbac.Policy {
	var out []*rbac.Policy
	for _, p := range m {
		if (ns == "" && p.Scope == rbac.Global) || (ns != "" && p.Scope == rbac.Namespace && p.Namespace == ns) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *rbac.Policy) int { return strings.Compare(a.Key(), b.Key()) })
	return out
}

// policyIndexes is a copy of a snapshot's policy indexes, by namespace (""
// for the Global list).
type policyIndexes map[string][]*rbac.Policy

func indexesOf(s *Snapshot, namespaces []string) policyIndexes {
	out := policyIndexes{"": slices.Clone(s.GlobalPolicies())}
	for _, ns := range namespaces {
		out[ns] = slices.Clone(s.NamespacePolicies(ns))
	}
	return out
}

// checkIndexes fails t where s's indexes differ from the model's, comparing
// pointers (the index must hold the very policies the table holds).
func checkIndexes(t *testing.T, what string, s *Snapshot, m policyModel, namespaces []string) {
	t.Helper()
	for _, ns := range append([]string{""}, namespaces...) {
		got := s.GlobalPolicies()
		if ns != "" {
			got = s.NamespacePolicies(ns)
		}
		want := m.wantIndex(ns)
		if len(got) != len(want) || !slices.Equal(got, want) {
			t.Fatalf("%s: index %q (-want +got):\n%s", what, ns, cmp.Diff(keys(want), keys(got)))
		}
	}
	if got, want := len(s.policies), len(m); got != want {
		t.Fatalf("%s: %d policies, want %d", what, got, want)
	}
}

// TestPolicyIndexRandomBatches drives the store with random batches of
// policy inserts, replacements (changing scope, TESTPLAN S3), re-inserts of
// the same or an earlier *Policy, removals and resets, and checks after
// every batch, and mid-batch through Batch.Snapshot, that the indexes equal
// a from-scratch computation; at the end it checks that no published
// snapshot's indexes changed.
func TestPolicyIndexRandomBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 2026))
	namespaces := []string{"a", "a-b", "a0", "b"} // prefixes and bytes around '/'
	names := []string{"p", "q", "r", "s"}
	var recent []*rbac.Policy // the last policies made, to insert again
	m := policyModel{}
	st := NewStore(Config{})
	type published struct {
		snap *Snapshot
		idx  policyIndexes
	}
	var history []published

	for batch := range 500 {
		st.Update(func(b *Batch) {
			for op := range rng.IntN(30) {
				what := fmt.Sprintf("batch %d op %d", batch, op)
				switch r := rng.IntN(20); {
				case r == 0:
					b.Reset()
					clear(m)
				case r < 3 && len(recent) > 0: // a recent, maybe replaced or removed, *Policy again
					p := recent[rng.IntN(len(recent))]
					if err := b.InsertPolicy(p); err != nil {
						t.Fatal(err)
					}
					m[p.Key()] = p
				case r < 5 && len(m) > 0: // the current *Policy again
					p := m[slices.Sorted(maps.Keys(m))[rng.IntN(len(m))]]
					if err := b.InsertPolicy(p); err != nil {
						t.Fatal(err)
					}
				case r < 9:
					key := namespaces[rng.IntN(len(namespaces))] + "/" + names[rng.IntN(len(names))]
					if got, want := b.RemovePolicy(key), m[key] != nil; got != want {
						t.Fatalf("%s: RemovePolicy(%s) = %v, want %v", what, key, got, want)
					}
					delete(m, key)
				case r < 11:
					checkIndexes(t, what+" (Batch.Snapshot)", b.Snapshot(), m, namespaces)
				default:
					p := policy(namespaces[rng.IntN(len(namespaces))], names[rng.IntN(len(names))], rbac.Scope(rng.IntN(3)))
					if err := b.InsertPolicy(p); err != nil {
						t.Fatal(err)
					}
					m[p.Key()] = p
					recent = append(recent, p)
					if len(recent) > 8 {
						recent = recent[1:]
					}
				}
			}
		})
		snap := st.Snapshot()
		checkIndexes(t, fmt.Sprintf("after batch %d", batch), snap, m, namespaces)
		history = append(history, published{snap, indexesOf(snap, namespaces)})
	}
	for i, h := range history {
		if got := indexesOf(h.snap, namespaces); !maps.EqualFunc(got, h.idx, slices.Equal) {
			t.Errorf("snapshot %d (generation %d): policy indexes changed after publication", i, h.snap.Generation())
		}
	}
}

// TestComparePoliciesKeyOrder checks that comparePolicies, which builds no
// keys, orders exactly as the keys do, including namespaces that are
// prefixes of each other, whose keys differ at the '/'.
func TestComparePoliciesKeyOrder(t *testing.T) {
	var ps []*rbac.Policy
	for _, ns := range []string{"a", "a-b", "a.b", "a0", "aa", "ab", "b", "a-"} {
		for _, name := range []string{"", "-", "0", "a", "z", "a/b"} {
			ps = append(ps, &rbac.Policy{Namespace: ns, Name: name})
		}
	}
	for _, x := range ps {
		for _, y := range ps {
			if got, want := comparePolicies(x, y), strings.Compare(x.Key(), y.Key()); got != want {
				t.Errorf("comparePolicies(%q, %q) = %d, want %d", x.Key(), y.Key(), got, want)
			}
		}
	}
}
