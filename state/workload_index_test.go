package state

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// workloadView is what a snapshot answers about workloads: each uid's
// workload, each probed address's preferred one, each probed FindWorkload,
// the workloads of each name, and the sorted list.
type workloadView struct {
	byUID  map[string]*Workload
	byIP   map[string]*Workload   // "network|ip" → preferred workload
	byName map[string]*Workload   // "node|namespace|name|sa" → FindWorkload's answer
	named  map[string][]*Workload // name → WorkloadsByName's answer
	all    []*Workload
}

var (
	indexNames      = []string{"a", "b", "c"}
	indexNodes      = []string{"", "n1", "n2"}
	indexNamespaces = []string{"ns", "other"}
	indexSAs        = []string{"", "sa"}
)

// findKeys calls fn with each probed FindWorkload's arguments and key.
func findKeys(fn func(key, node, ns, name, sa string)) {
	for _, node := range indexNodes {
		for _, ns := range indexNamespaces {
			for _, name := range indexNames {
				for _, sa := range indexSAs {
					fn(node+"|"+ns+"|"+name+"|"+sa, node, ns, name, sa)
				}
			}
		}
	}
}

var (
	indexNetworks = []string{"", "net-b"}
	indexIPs      = []netip.Addr{ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"), ip("fd00::1"), ip("fd00::2")}
)

func viewOf(s *Snapshot, uids []string) workloadView {
	v := workloadView{byUID: map[string]*Workload{}, byIP: map[string]*Workload{}, byName: map[string]*Workload{},
		named: map[string][]*Workload{}, all: s.Workloads()}
	findKeys(func(key, node, ns, name, sa string) {
		if w := s.FindWorkload(node, ns, name, sa); w != nil {
			v.byName[key] = w
		}
	})
	for _, name := range append(indexNames, "unknown") {
		for w := range s.WorkloadsByName(name) {
			v.named[name] = append(v.named[name], w)
		}
	}
	for _, uid := range uids {
		if w := s.WorkloadByUID(uid); w != nil {
			v.byUID[uid] = w
		}
	}
	for _, n := range append(indexNetworks, "net-unknown") {
		for _, a := range indexIPs {
			if w := s.WorkloadByIP(n, a); w != nil {
				v.byIP[n+"|"+a.String()] = w
			}
		}
	}
	return v
}

// modelView computes the view from the model's workloads from scratch.
func modelView(m map[string]*Workload) workloadView {
	v := workloadView{byUID: map[string]*Workload{}, byIP: map[string]*Workload{}, byName: map[string]*Workload{},
		named: map[string][]*Workload{}}
	findKeys(func(key, node, ns, name, sa string) {
		for _, w := range m {
			saOK := w.ServiceAccount == sa || (sa == "" && w.ServiceAccount == DefaultServiceAccount) ||
				(w.ServiceAccount == "" && sa == DefaultServiceAccount)
			if w.Namespace == ns && w.Name == name && (node == "" || w.Node == node) && saOK {
				if cur := v.byName[key]; cur == nil || w.UID < cur.UID {
					v.byName[key] = w
				}
			}
		}
	})
	for uid, w := range m {
		v.byUID[uid] = w
		v.all = append(v.all, w)
		if w.NetworkMode == NetworkHost {
			continue
		}
		for _, a := range w.Addresses {
			k := w.Network + "|" + a.String()
			if cur := v.byIP[k]; cur == nil || modelIPPreference(w, cur) < 0 {
				v.byIP[k] = w
			}
		}
	}
	slices.SortFunc(v.all, func(a, b *Workload) int { return cmp.Compare(a.UID, b.UID) })
	for _, w := range v.all {
		v.named[w.Name] = append(v.named[w.Name], w)
	}
	return v
}

// modelIPPreference orders workloads sharing an address (SPEC §3.4).
func modelIPPreference(a, b *Workload) int {
	rank := func(w *Workload) int { return ipRankOf(w.IsPod(), w.Protocol == TunnelHBONE) }
	if c := cmp.Compare(rank(a), rank(b)); c != 0 {
		return c
	}
	return cmp.Compare(a.UID, b.UID)
}

// same reports whether the store's workload got is the model's want: nil
// both, or equal in every field (the store builds its workloads from
// records, so they are equal, not the same pointer).
func same(got, want *Workload) bool {
	return (got == nil) == (want == nil) && (got == nil || reflect.DeepEqual(*got, *want))
}

func sameView(a, b workloadView) error {
	for uid, w := range a.byUID {
		if !same(b.byUID[uid], w) {
			return fmt.Errorf("uid %s: %v, want %v", uid, b.byUID[uid], w)
		}
	}
	if len(a.byUID) != len(b.byUID) {
		return fmt.Errorf("%d uids found, want %d", len(b.byUID), len(a.byUID))
	}
	for k, w := range a.byIP {
		if !same(b.byIP[k], w) {
			return fmt.Errorf("address %s: %v, want %v", k, uidOf(b.byIP[k]), uidOf(w))
		}
	}
	if len(a.byIP) != len(b.byIP) {
		return fmt.Errorf("%d addresses found, want %d", len(b.byIP), len(a.byIP))
	}
	for k, w := range a.byName {
		if !same(b.byName[k], w) {
			return fmt.Errorf("FindWorkload(%s): %v, want %v", k, uidOf(b.byName[k]), uidOf(w))
		}
	}
	if len(a.byName) != len(b.byName) {
		return fmt.Errorf("FindWorkload found %d, want %d", len(b.byName), len(a.byName))
	}
	for name, ws := range a.named {
		if !slices.EqualFunc(b.named[name], ws, same) {
			return fmt.Errorf("WorkloadsByName(%s): %v, want %v", name, uidsOf(b.named[name]), uidsOf(ws))
		}
	}
	for name, ws := range b.named {
		if len(a.named[name]) == 0 {
			return fmt.Errorf("WorkloadsByName(%s): %v, want none", name, uidsOf(ws))
		}
	}
	if !slices.EqualFunc(a.all, b.all, same) {
		return fmt.Errorf("Workloads() lists %d, want %d", len(b.all), len(a.all))
	}
	return nil
}

// checkSlots checks the slot table's own invariants: every uid's slot holds
// it, every other slot is free and listed once, and byIP.more holds exactly
// the addresses byIP marks as shared.
func checkSlots(t *testing.T, what string, s *Snapshot) {
	t.Helper()
	used := map[int32]bool{}
	for i, rec := range s.recs {
		if rec == "" {
			continue
		}
		uid := recUIDOf(rec)
		if slot, ok := s.slotOf(uid); !ok || slot != int32(i) {
			t.Fatalf("%s: the uid of slot %d, %s, finds slot %d (%v)", what, i, uid, slot, ok)
		}
		if got := s.at(int32(i)); got.UID != uid || s.at(int32(i)) != got {
			t.Fatalf("%s: slot %d builds %s, or not from the cache the second time", what, i, got.UID)
		}
		used[int32(i)] = true
	}
	if n := s.byUID.Len(); n != len(used) {
		t.Fatalf("%s: %d uids indexed, %d workloads", what, n, len(used))
	}
	free := map[int32]bool{}
	for _, slot := range s.free {
		if used[slot] || free[slot] || s.recs[slot] != "" {
			t.Fatalf("%s: free slot %d is in use or listed twice", what, slot)
		}
		free[slot] = true
	}
	if len(used)+len(free) != len(s.recs) {
		t.Fatalf("%s: %d slots, %d used and %d free", what, len(s.recs), len(used), len(free))
	}
	checkSlotIndex(t, what+": byName", s.byName, s, func(h uint64, w *Workload) bool {
		return nameHash(w.Name) == h
	})
	checkSlotIndex(t, what+": byIP", s.byIP, s, func(k ipSlot, w *Workload) bool {
		return slices.ContainsFunc(w.Addresses, func(a netip.Addr) bool { return a.As16() == k.addr })
	})
}

// checkSlotIndex checks that x lists two or more workloads exactly where one
// says -1, and that each single slot holds a workload keyOK accepts for its
// key.
func checkSlotIndex[K comparable](t *testing.T, what string, x slotIndex[K], s *Snapshot, keyOK func(K, *Workload) bool) {
	t.Helper()
	shared := 0
	for k, slot := range x.one {
		if slot < 0 {
			shared++
			if len(x.slots(k, nil)) < 2 {
				t.Fatalf("%s: a shared key lists fewer than two workloads", what)
			}
		} else if w := s.at(slot); w == nil || !keyOK(k, w) {
			t.Fatalf("%s: key %v holds slot %d, %v", what, k, slot, uidOf(w))
		}
	}
	if shared != len(x.more) {
		t.Fatalf("%s: %d shared keys, %d lists in more", what, shared, len(x.more))
	}
}

func uidsOf(ws []*Workload) []string {
	var out []string
	for _, w := range ws {
		out = append(out, uidOf(w))
	}
	return out
}

func uidOf(w *Workload) string {
	if w == nil {
		return "<nil>"
	}
	return w.UID
}

// TestWorkloadIndexRandomBatches drives the store with random batches of
// workload inserts, replacements (moving addresses and networks), removals
// and resets, with few addresses so that many workloads share one, and
// checks after each batch, and mid-batch through Batch.Snapshot, that the
// uid and address lookups and Workloads equal a from-scratch computation;
// at the end, that no published snapshot's answers changed although later
// batches reused the slots its workloads held.
func TestWorkloadIndexRandomBatches(t *testing.T) {
	// Compacting the shared table often, so that the run crosses many
	// compactions.
	origSlack := compactSlack
	t.Cleanup(func() { compactSlack = origSlack })
	compactSlack = 16
	t.Run("hashes", workloadIndexRandomBatches)
	// Every name in one hash, so names collide in byName's lists.
	orig := nameHash
	t.Cleanup(func() { nameHash = orig })
	nameHash = func(name string) uint64 { return uint64(len(name) % 2) }
	t.Run("colliding names", workloadIndexRandomBatches)
	// Every uid in one of three hashes, so uids collide in byUID.
	origUID := uidHash
	t.Cleanup(func() { uidHash = origUID })
	uidHash = func(uid string) uint64 { return uint64(len(uid) % 3) }
	t.Run("colliding uids", workloadIndexRandomBatches)
}

func workloadIndexRandomBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 2026))
	kinds := []string{"Pod", "WorkloadEntry"}
	var uids []string
	for i := range 12 {
		uids = append(uids, fmt.Sprintf("c//%s/ns/w%d", kinds[i%2], i))
	}
	mk := func(uid string) *Workload {
		w := &Workload{UID: uid, Namespace: indexNamespaces[rng.IntN(2)], Name: indexNames[rng.IntN(len(indexNames))],
			Node: indexNodes[1+rng.IntN(2)], ServiceAccount: indexSAs[rng.IntN(2)],
			Network: indexNetworks[rng.IntN(len(indexNetworks))], Protocol: TunnelProtocol(rng.IntN(2))}
		if rng.IntN(8) == 0 {
			w.NetworkMode = NetworkHost
		}
		for range rng.IntN(3) {
			if a := indexIPs[rng.IntN(len(indexIPs))]; !slices.Contains(w.Addresses, a) {
				w.Addresses = append(w.Addresses, a)
			}
		}
		// Shared fields: a few common ones, and many distinct port maps, so
		// that the store's shared table is compacted during the run.
		switch rng.IntN(4) {
		case 0:
		case 1:
			w.Services = map[string]PortMap{"ns/web": {80: 8080}}
			w.AuthorizationPolicies = []string{"ns/allow"}
		default:
			w.Services = map[string]PortMap{"ns/web": {80: uint16(rng.IntN(5000))}, "ns/db": nil}
			if rng.IntN(2) == 0 {
				w.Waypoint = &GatewayAddress{Hostname: &NamespacedHostname{"ns", "wp"}, HBONEMTLSPort: 15008}
			}
		}
		return w
	}
	m := map[string]*Workload{}
	type published struct {
		snap *Snapshot
		view workloadView
	}
	var history []published
	st := NewStore(Config{})
	for batch := range 400 {
		st.Update(func(b *Batch) {
			for op := range rng.IntN(12) {
				what := fmt.Sprintf("batch %d op %d", batch, op)
				uid := uids[rng.IntN(len(uids))]
				switch r := rng.IntN(20); {
				case r == 0:
					b.Reset()
					clear(m)
				case r < 7:
					if got, want := b.RemoveWorkload(uid), m[uid] != nil; got != want {
						t.Fatalf("%s: RemoveWorkload(%s) = %v, want %v", what, uid, got, want)
					}
					delete(m, uid)
				case r < 9:
					if err := sameView(modelView(m), viewOf(b.Snapshot(), uids)); err != nil {
						t.Fatalf("%s (Batch.Snapshot): %v", what, err)
					}
				default:
					w := mk(uid)
					if err := b.InsertWorkload(w); err != nil {
						t.Fatal(err)
					}
					m[uid] = w // its addresses are unmapped already: the store's is equal
				}
			}
		})
		snap := st.Snapshot()
		if err := sameView(modelView(m), viewOf(snap, uids)); err != nil {
			t.Fatalf("after batch %d: %v", batch, err)
		}
		checkSlots(t, fmt.Sprintf("after batch %d", batch), snap)
		for _, uid := range uids {
			got, ok := snap.WorkloadNamesByUID(uid)
			if w := m[uid]; ok != (w != nil) || (ok && got != w.Names()) {
				t.Fatalf("after batch %d: WorkloadNamesByUID(%s) = %+v, %v; want the model's %+v", batch, uid, got, ok, w)
			}
		}
		history = append(history, published{snap, viewOf(snap, uids)})
	}
	if wt := st.Snapshot().wt; wt.nextCompact == 1+compactSlack {
		t.Error("the shared table was never compacted: the run does not test it")
	}
	for i, h := range history {
		if err := sameView(h.view, viewOf(h.snap, uids)); err != nil {
			t.Errorf("snapshot %d (generation %d) changed after publication: %v", i, h.snap.Generation(), err)
		}
	}
}
