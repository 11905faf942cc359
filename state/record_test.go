package state

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// randomWorkload returns a valid workload with every field drawn at random,
// strings long enough for two-byte lengths among them.
func randomWorkload(rng *rand.Rand, i int) *Workload {
	str := func() string {
		switch rng.IntN(4) {
		case 0:
			return ""
		case 1:
			return strings.Repeat("x", 120+rng.IntN(300)) // a length of two bytes or more
		}
		return fmt.Sprintf("s%d", rng.IntN(1000))
	}
	name := str()
	uid := fmt.Sprintf("c%d//Pod/ns/%d", i, rng.IntN(100))
	if rng.IntN(2) == 0 {
		uid += name // the name is the uid's suffix, as the decoder's often is
	}
	w := &Workload{
		UID: uid, Name: name, Namespace: str(), Hostname: str(), Network: str(),
		Protocol: TunnelProtocol(rng.IntN(int(TunnelHBONE) + 1)), TrustDomain: str(), ServiceAccount: str(),
		Node: str(), CanonicalName: str(), CanonicalRevision: str(),
		WorkloadType: WorkloadType(rng.IntN(int(WorkloadJob) + 1)), WorkloadName: str(),
		NativeTunnel: rng.IntN(2) == 0, Status: HealthStatus(rng.IntN(int(StatusUnhealthy) + 1)),
		ClusterID: str(), Locality: Locality{str(), str(), str()},
		NetworkMode: NetworkMode(rng.IntN(int(NetworkHost) + 1)), Capacity: rng.Uint32(),
	}
	switch rng.IntN(3) {
	case 0: // nil
	case 1:
		w.Addresses = []netip.Addr{}
	default:
		for range 1 + rng.IntN(3) {
			var b [16]byte
			for j := range b {
				b[j] = byte(rng.IntN(256))
			}
			a := netip.AddrFrom16(b)
			if rng.IntN(2) == 0 {
				a = netip.AddrFrom4([4]byte(b[:4]))
			}
			w.Addresses = append(w.Addresses, a.Unmap())
		}
	}
	if rng.IntN(2) == 0 {
		w.Services = map[string]PortMap{"ns/a": {80: 8080, 443: 0}, "ns/b": nil}
		w.AuthorizationPolicies = []string{"ns/p" + str()}
		w.Waypoint = &GatewayAddress{Hostname: &NamespacedHostname{"ns", "wp"}, HBONEMTLSPort: 15008}
		w.NetworkGateway = &GatewayAddress{Address: &NetworkAddress{"n", netip.MustParseAddr("fd00::1")}}
		w.ApplicationTunnel = &ApplicationTunnel{Protocol: AppTunnelProxy, Port: 1}
	}
	return w
}

// TestRecordRoundTrip: a workload decoded from its record equals the
// workload encoded, field by field, and its strings are the record's bytes,
// not copies.
func TestRecordRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	wt := newWorkloadTables()
	var key []byte
	for i := range 2000 {
		w := randomWorkload(rng, i)
		sh := wt.intern(w, &key)
		rec := string(appendRecord(nil, w, sh))
		bw := buildWorkload(rec, &wt.ents[sh])
		if !reflect.DeepEqual(bw.Workload, *w) {
			t.Fatalf("workload %d:\n got %+v\nwant %+v", i, bw.Workload, *w)
		}
		if recUIDOf(rec) != w.UID || recSharedOf(rec) != sh {
			t.Fatalf("workload %d: uid %q, shared %d from the record", i, recUIDOf(rec), recSharedOf(rec))
		}
		for f, want := range map[int]string{recName: w.Name, recNamespace: w.Namespace, recHostname: w.Hostname, recNode: w.Node, recSubzone: w.Locality.Subzone} {
			var fields [recNumStrings]string
			recStrings(rec, f, &fields) // decoding only up to f, as FindWorkload does
			if got := fields[f]; got != want {
				t.Fatalf("workload %d: field %d = %q, want %q", i, f, got, want)
			}
		}
		if got, want := recIPRank(rec), ipRankOf(w.IsPod(), w.Protocol == TunnelHBONE); got != want {
			t.Fatalf("workload %d: rank %d, want %d", i, got, want)
		}
		if w.UID != "" && !inString(bw.UID, rec) {
			t.Fatalf("workload %d: the uid was copied out of the record", i)
		}
		if other := withShared(rec, sh+7); recSharedOf(other) != sh+7 || recUIDOf(other) != w.UID || recSharedOf(rec) != sh {
			t.Fatalf("workload %d: withShared changed more than the index, or the original", i)
		}
	}
}

// inString reports whether s's bytes lie inside of's.
func inString(s, of string) bool {
	if len(s) == 0 {
		return true
	}
	p, q := reflect.ValueOf(s).UnsafePointer(), reflect.ValueOf(of).UnsafePointer()
	return uintptr(p) >= uintptr(q) && uintptr(p)+uintptr(len(s)) <= uintptr(q)+uintptr(len(of))
}

// TestSharedEntriesInterned: workloads whose services, policies, gateways
// and tunnel are equal (as values, whatever their maps' order) share one
// entry; a difference anywhere in them, nil against empty included, makes
// another.
func TestSharedEntriesInterned(t *testing.T) {
	wt := newWorkloadTables()
	var key []byte
	base := func() *Workload {
		return &Workload{
			UID:                   "u",
			Services:              map[string]PortMap{"ns/a": {80: 8080, 81: 1}, "ns/b": {}},
			AuthorizationPolicies: []string{"ns/p"},
			Waypoint:              &GatewayAddress{Address: &NetworkAddress{"", netip.MustParseAddr("10.0.0.1")}, HBONEMTLSPort: 15008},
		}
	}
	first := wt.intern(base(), &key)
	if first == recNoShared {
		t.Fatal("a workload with services got the empty entry")
	}
	if got := wt.intern(base(), &key); got != first {
		t.Errorf("an equal workload got entry %d, want %d", got, first)
	}
	if got := wt.intern(&Workload{UID: "u"}, &key); got != recNoShared {
		t.Errorf("a workload with none got entry %d", got)
	}
	for name, change := range map[string]func(w *Workload){
		"target port":   func(w *Workload) { w.Services["ns/a"][81] = 2 },
		"nil port map":  func(w *Workload) { w.Services["ns/b"] = nil },
		"empty map":     func(w *Workload) { w.Services = map[string]PortMap{} },
		"policies":      func(w *Workload) { w.AuthorizationPolicies = []string{"ns/q"} },
		"no policies":   func(w *Workload) { w.AuthorizationPolicies = []string{} },
		"waypoint port": func(w *Workload) { w.Waypoint.HBONEMTLSPort = 1 },
		"waypoint host": func(w *Workload) {
			w.Waypoint = &GatewayAddress{Hostname: &NamespacedHostname{"ns", "wp"}}
		},
		"gateway": func(w *Workload) { w.NetworkGateway = w.Waypoint },
		"tunnel":  func(w *Workload) { w.ApplicationTunnel = &ApplicationTunnel{} },
	} {
		w := base()
		change(w)
		if got := wt.intern(w, &key); got == first || got == recNoShared {
			t.Errorf("%s: got entry %d, the unchanged workload's is %d", name, got, first)
		}
	}
}

// TestSharedTableCompacts: as workloads' services keep changing, the
// store's shared table is compacted rather than grown without bound, every
// workload keeps its own services through it, and snapshots published
// before a compaction still answer as they did.
func TestSharedTableCompacts(t *testing.T) {
	st := NewStore(Config{})
	const n = 50
	servicesOf := func(round, i int) map[string]PortMap {
		return map[string]PortMap{fmt.Sprintf("ns/s%d", i): {uint16(round + 1): uint16(i)}}
	}
	var early *Snapshot
	for round := range 100 {
		update(t, st, func(b *Batch, must func(error)) {
			for i := range n {
				w := pod("ns", fmt.Sprintf("p%d", i), fmt.Sprintf("10.0.0.%d", i+1))
				w.Services = servicesOf(round, i)
				must(b.InsertWorkload(w))
			}
		})
		if round == 3 {
			early = st.Snapshot()
		}
	}
	s := st.Snapshot()
	// A batch may add up to n entries past the threshold before its
	// commit compacts.
	if got, limit := len(s.wt.ents), 2*(n+1)+compactSlack+n; got > limit {
		t.Errorf("the shared table holds %d entries for %d workloads, over %d", got, n, limit)
	}
	for i := range n {
		uid := pod("ns", fmt.Sprintf("p%d", i)).UID
		if got, want := s.WorkloadByUID(uid).Services, servicesOf(99, i); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: services %v, want %v", uid, got, want)
		}
		if got, want := early.WorkloadByUID(uid).Services, servicesOf(3, i); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s in the early snapshot: services %v, want %v", uid, got, want)
		}
	}
}

// TestLookupsShareTheCache: looking a workload up twice gives the same
// built workload, in the snapshot that stored it and in later ones that did
// not change it; a replaced workload is built anew, and the snapshot before
// the replacement still gives the old one.
func TestLookupsShareTheCache(t *testing.T) {
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(pod("ns", "a", "10.0.0.1")))
		must(b.InsertWorkload(pod("ns", "b", "10.0.0.2")))
	})
	s1 := st.Snapshot()
	a := s1.WorkloadByIP("", ip("10.0.0.1"))
	if s1.WorkloadByUID(a.UID) != a {
		t.Error("two lookups of one workload built it twice")
	}
	update(t, st, func(b *Batch, must func(error)) {
		w := pod("ns", "b", "10.0.0.3")
		must(b.InsertWorkload(w))
	})
	s2 := st.Snapshot()
	if s2.WorkloadByUID(a.UID) != a {
		t.Error("an unchanged workload was built again in the next snapshot")
	}
	b2 := s2.WorkloadByIP("", ip("10.0.0.3"))
	b1 := s1.WorkloadByIP("", ip("10.0.0.2"))
	if b1 == nil || b2 == nil || b1.UID != b2.UID || b1.Addresses[0] == b2.Addresses[0] {
		t.Fatalf("the old snapshot gives %v, the new %v", b1, b2)
	}
	if s2.WorkloadByIP("", ip("10.0.0.2")) != nil {
		t.Error("the new snapshot still finds b at its old address")
	}
	// Inserting an equal workload again keeps its record: the cache's
	// workload stays, and the update still lists it as changed.
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(pod("ns", "a", "10.0.0.1"))) })
	s3 := st.Snapshot()
	if s3.WorkloadByUID(a.UID) != a {
		t.Error("re-inserting an equal workload replaced its record")
	}
	if got := s3.Changes().Workloads; !slices.Equal(got, []string{a.UID}) {
		t.Errorf("Changes().Workloads = %v, want [%s]", got, a.UID)
	}
}

// TestCacheCollisions: in a store larger than the cache, workloads whose
// slots share a cache entry each get their own workload, whichever was
// looked up last.
func TestCacheCollisions(t *testing.T) {
	st := NewStore(Config{})
	const n = cacheSize + 10
	uid := func(i int) string { return fmt.Sprintf("c//Pod/ns/p%d", i) }
	update(t, st, func(b *Batch, must func(error)) {
		for i := range n {
			must(b.InsertWorkload(&Workload{UID: uid(i), Name: fmt.Sprintf("p%d", i), Namespace: "ns"}))
		}
	})
	s := st.Snapshot()
	for round := range 2 {
		for _, i := range []int{3, 3 + cacheSize, 5 + cacheSize, 5} { // slots 3 and 5 share entries with 4,099 and 4,101
			if w := s.WorkloadByUID(uid(i)); w == nil || w.UID != uid(i) {
				t.Fatalf("round %d: WorkloadByUID(%s) = %v", round, uid(i), uidOf(w))
			}
		}
	}
}
