package state

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWorkloadByIP(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns1", "a", "10.0.0.1", "fd00::1")
	b := pod("ns1", "b", "10.0.0.2")
	b.Network = "net2"
	hostNet := pod("ns1", "host", "10.0.0.3")
	hostNet.NetworkMode = NetworkHost
	mapped := pod("ns1", "mapped", "::ffff:10.0.0.4")
	update(t, st, func(bt *Batch, must func(error)) {
		for _, w := range []*Workload{a, b, hostNet, mapped} {
			must(bt.InsertWorkload(w))
		}
	})
	snap := st.Snapshot()
	tests := []struct {
		network, ip string
		want        string // uid or ""
	}{
		{"", "10.0.0.1", a.UID},
		{"", "fd00::1", a.UID},
		{"", "::ffff:10.0.0.1", a.UID}, // lookups unmap
		{"net2", "10.0.0.1", ""},       // wrong network
		{"net2", "10.0.0.2", b.UID},
		{"", "10.0.0.2", ""},
		{"", "10.0.0.3", ""}, // HostNetwork is not indexed
		{"", "10.0.0.4", mapped.UID},
		{"", "10.9.9.9", ""},
	}
	for _, tt := range tests {
		got := ""
		if w := snap.WorkloadByIP(tt.network, ip(tt.ip)); w != nil {
			got = w.UID
		}
		if got != tt.want {
			t.Errorf("WorkloadByIP(%q, %s) = %q, want %q", tt.network, tt.ip, got, tt.want)
		}
	}
	if w := snap.WorkloadByUID(hostNet.UID); w == nil || w.Name != "host" {
		t.Errorf("WorkloadByUID(%q) = %v, want the host-network workload", hostNet.UID, w)
	}
}

func TestWorkloadByIPSharedPreference(t *testing.T) {
	// SPEC §3.4: Pod with HBONE, then Pod, then HBONE, then any.
	mk := func(uid string, proto TunnelProtocol) *Workload {
		return &Workload{UID: uid, Namespace: "ns", Addresses: []netip.Addr{ip("10.1.1.1")}, Protocol: proto}
	}
	podHBONE := mk("c//Pod/ns/p1", TunnelHBONE)
	podTCP := mk("c//Pod/ns/p2", TunnelNone)
	entryHBONE := mk("c//WorkloadEntry/ns/e1", TunnelHBONE)
	entryTCP := mk("c//WorkloadEntry/ns/e2", TunnelNone)
	tests := []struct {
		name   string
		insert []*Workload
		want   string
	}{
		{"pod hbone beats all", []*Workload{entryTCP, entryHBONE, podTCP, podHBONE}, podHBONE.UID},
		{"pod beats hbone", []*Workload{entryHBONE, podTCP, entryTCP}, podTCP.UID},
		{"hbone beats tcp", []*Workload{entryTCP, entryHBONE}, entryHBONE.UID},
		{"only one", []*Workload{entryTCP}, entryTCP.UID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := NewStore(Config{})
			update(t, st, func(b *Batch, must func(error)) {
				for _, w := range tt.insert {
					must(b.InsertWorkload(w))
				}
			})
			if got := st.Snapshot().WorkloadByIP("", ip("10.1.1.1")); got == nil || got.UID != tt.want {
				t.Fatalf("WorkloadByIP = %v, want %s", got, tt.want)
			}
		})
	}
	// Removing the preferred one falls back to the next.
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(podHBONE))
		must(b.InsertWorkload(entryHBONE))
	})
	st.Update(func(b *Batch) { b.RemoveWorkload(podHBONE.UID) })
	if got := st.Snapshot().WorkloadByIP("", ip("10.1.1.1")); got == nil || got.UID != entryHBONE.UID {
		t.Fatalf("after removal WorkloadByIP = %v, want %s", got, entryHBONE.UID)
	}
}

func TestWorkloadReplaceMovesIndexes(t *testing.T) {
	st := NewStore(Config{})
	w := pod("ns", "a", "10.0.0.1")
	w.Services = map[string]PortMap{"ns/s1": {80: 8080}}
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(w))
		must(b.InsertService(svc("ns", "s1")))
		must(b.InsertService(svc("ns", "s2")))
	})
	w2 := pod("ns", "a", "10.0.0.2")
	w2.Services = map[string]PortMap{"ns/s2": {80: 9090}}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(w2)) })
	snap := st.Snapshot()
	if got := snap.WorkloadByIP("", ip("10.0.0.1")); got != nil {
		t.Errorf("old IP still indexed: %v", got.UID)
	}
	if got := snap.WorkloadByIP("", ip("10.0.0.2")); got == nil || got.UID != w.UID {
		t.Errorf("new IP not indexed: %v", got)
	}
	if got := endpointUIDs(snap.ServiceByKey("ns/s1")); len(got) != 0 {
		t.Errorf("s1 endpoints = %v, want none", got)
	}
	want := map[string]Endpoint{w.UID: {WorkloadUID: w.UID, Ports: PortMap{80: 9090}}}
	if diff := cmp.Diff(want, snap.ServiceByKey("ns/s2").Endpoints.Map()); diff != "" {
		t.Errorf("s2 endpoints (-want +got):\n%s", diff)
	}
	// Removal clears everything.
	st.Update(func(b *Batch) {
		if !b.RemoveWorkload(w.UID) {
			t.Error("RemoveWorkload = false, want true")
		}
	})
	snap = st.Snapshot()
	if snap.WorkloadByIP("", ip("10.0.0.2")) != nil || snap.WorkloadByUID(w.UID) != nil {
		t.Error("workload still present after removal")
	}
	if got := endpointUIDs(snap.ServiceByKey("ns/s2")); len(got) != 0 {
		t.Errorf("s2 endpoints after removal = %v, want none", got)
	}
}

func TestServiceByVIP(t *testing.T) {
	st := NewStore(Config{})
	shared := vip("", "10.96.0.1")
	first := svc("a", "first.example", shared)
	canonical := svc("b", "canon.example", shared)
	canonical.Canonical = true
	hidden := svc("c", "hidden.example", shared)
	hidden.Visibility = VisibilityNamespace
	onlyHidden := svc("d", "only-hidden.example", vip("", "10.96.0.2"))
	onlyHidden.Visibility = VisibilityNamespace
	other := svc("a", "other-net.example", vip("net2", "10.96.0.1"))

	wide := svc("e", "wide.example")
	wide.CIDRVIPs = []NetworkPrefix{cidr("", "10.200.0.0/16")}
	narrow := svc("f", "narrow.example")
	narrow.CIDRVIPs = []NetworkPrefix{cidr("", "10.200.1.0/24")}
	narrowCanon := svc("g", "narrow-canon.example")
	narrowCanon.CIDRVIPs = []NetworkPrefix{cidr("", "10.200.1.0/24")}
	narrowCanon.Canonical = true
	hiddenCIDR := svc("h", "hidden-cidr.example")
	hiddenCIDR.CIDRVIPs = []NetworkPrefix{cidr("", "10.200.1.0/25")}
	hiddenCIDR.Visibility = VisibilityNamespace
	single := svc("i", "single.example")
	single.CIDRVIPs = []NetworkPrefix{cidr("", "10.201.0.1/32")} // full length = exact VIP
	// A hidden exact VIP inside a CIDR falls back to the CIDR.
	hiddenExact := svc("j", "hidden-exact.example", vip("", "10.200.2.2"))
	hiddenExact.Visibility = VisibilityNamespace

	update(t, st, func(b *Batch, must func(error)) {
		for _, s := range []*Service{first, canonical, hidden, onlyHidden, other, wide, narrow, narrowCanon, hiddenCIDR, single, hiddenExact} {
			must(b.InsertService(s))
		}
	})
	snap := st.Snapshot()
	tests := []struct {
		name, network, ip, clientNS string
		want                        string // key or ""
	}{
		{"client namespace wins", "", "10.96.0.1", "a", "a/first.example"},
		{"client namespace wins over canonical", "", "10.96.0.1", "c", "c/hidden.example"},
		{"canonical beats first seen", "", "10.96.0.1", "zz", "b/canon.example"},
		{"unknown client namespace", "", "10.96.0.1", "", "b/canon.example"},
		{"mapped ip", "", "::ffff:10.96.0.1", "zz", "b/canon.example"},
		{"network separates", "net2", "10.96.0.1", "zz", "a/other-net.example"},
		{"hidden from others", "", "10.96.0.2", "zz", ""},
		{"hidden from empty ns", "", "10.96.0.2", "", ""},
		{"visible in own namespace", "", "10.96.0.2", "d", "d/only-hidden.example"},
		{"longest prefix", "", "10.200.1.7", "zz", "g/narrow-canon.example"},
		{"wide only", "", "10.200.9.9", "zz", "e/wide.example"},
		{"client namespace beats longer prefix", "", "10.200.1.7", "e", "e/wide.example"},
		{"canonical breaks prefix tie", "", "10.200.1.200", "zz", "g/narrow-canon.example"},
		{"hidden cidr visible in own ns", "", "10.200.1.7", "h", "h/hidden-cidr.example"},
		{"full-length cidr is exact", "", "10.201.0.1", "zz", "i/single.example"},
		{"hidden exact falls back to cidr", "", "10.200.2.2", "zz", "e/wide.example"},
		{"hidden exact in own ns", "", "10.200.2.2", "j", "j/hidden-exact.example"},
		{"no match", "", "192.168.0.1", "a", ""},
		{"cidr wrong network", "net2", "10.200.1.7", "zz", ""},
	}
	for _, tt := range tests {
		got := ""
		if s := snap.ServiceByVIP(tt.network, ip(tt.ip), tt.clientNS); s != nil {
			got = s.Key()
		}
		if got != tt.want {
			t.Errorf("%s: ServiceByVIP(%q, %s, %q) = %q, want %q", tt.name, tt.network, tt.ip, tt.clientNS, got, tt.want)
		}
	}
}

func TestServiceByVIPFirstSeen(t *testing.T) {
	st := NewStore(Config{})
	v := vip("", "10.96.0.9")
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertService(svc("z", "z.example", v)))
		must(b.InsertService(svc("a", "a.example", v)))
	})
	if got := st.Snapshot().ServiceByVIP("", v.Address, "").Key(); got != "z/z.example" {
		t.Fatalf("first seen = %s, want z/z.example", got)
	}
	// Replacing the first service keeps its position.
	update(t, st, func(b *Batch, must func(error)) {
		s := svc("z", "z.example", v)
		s.SubjectAltNames = []string{"x"}
		must(b.InsertService(s))
	})
	if got := st.Snapshot().ServiceByVIP("", v.Address, "").Key(); got != "z/z.example" {
		t.Fatalf("after replace first seen = %s, want z/z.example", got)
	}
	// Moving it off the VIP and back puts it last.
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(svc("z", "z.example"))) })
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(svc("z", "z.example", v))) })
	if got := st.Snapshot().ServiceByVIP("", v.Address, "").Key(); got != "a/a.example" {
		t.Fatalf("after re-adding first seen = %s, want a/a.example", got)
	}
}

func TestServicesByHostname(t *testing.T) {
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertService(svc("zeta", "h.example")))
		must(b.InsertService(svc("alpha", "h.example")))
		must(b.InsertService(svc("alpha", "other.example")))
	})
	hostKeys := func(snap *Snapshot, h string) []string {
		var out []string
		for _, s := range snap.ServicesByHostname(h) {
			out = append(out, s.Key())
		}
		return out
	}
	if diff := cmp.Diff([]string{"alpha/h.example", "zeta/h.example"}, hostKeys(st.Snapshot(), "h.example")); diff != "" {
		t.Errorf("ServicesByHostname (-want +got):\n%s", diff)
	}
	// An endpoint change replaces the service value; the hostname index must
	// follow.
	w := pod("alpha", "a", "10.0.0.1")
	w.Services = map[string]PortMap{"alpha/h.example": {80: 80}}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(w)) })
	snap := st.Snapshot()
	for _, s := range snap.ServicesByHostname("h.example") {
		if s != snap.ServiceByKey(s.Key()) {
			t.Errorf("hostname index holds a stale value of %s", s.Key())
		}
	}
	if got := endpointUIDs(snap.ServicesByHostname("h.example")[0]); !cmp.Equal(got, []string{w.UID}) {
		t.Errorf("endpoints via hostname = %v, want [%s]", got, w.UID)
	}
	st.Update(func(b *Batch) { b.RemoveService("zeta/h.example") })
	if diff := cmp.Diff([]string{"alpha/h.example"}, hostKeys(st.Snapshot(), "h.example")); diff != "" {
		t.Errorf("after removal (-want +got):\n%s", diff)
	}
	if got := st.Snapshot().ServicesByHostname("nope"); got != nil {
		t.Errorf("unknown hostname = %v, want nil", got)
	}
	var names []string
	for _, s := range st.Snapshot().Services() {
		names = append(names, s.Key())
	}
	if diff := cmp.Diff([]string{"alpha/h.example", "alpha/other.example"}, names); diff != "" {
		t.Errorf("Services() (-want +got):\n%s", diff)
	}
}

func TestFindWorkload(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns", "a", "10.0.0.1")
	a.Node = "n1"
	b := pod("ns", "b", "10.0.0.2")
	b.Node = "n2"
	b.ServiceAccount = "sa-b"
	update(t, st, func(bt *Batch, must func(error)) {
		must(bt.InsertWorkload(a))
		must(bt.InsertWorkload(b))
	})
	snap := st.Snapshot()
	tests := []struct {
		node, ns, name, sa string
		want               string
	}{
		{"n1", "ns", "a", "default", a.UID}, // "" service account means default
		{"n1", "ns", "a", "", a.UID},
		{"", "ns", "a", "default", a.UID},
		{"n2", "ns", "a", "default", ""},
		{"n2", "ns", "b", "sa-b", b.UID},
		{"n2", "ns", "b", "default", ""},
		{"n2", "other", "b", "sa-b", ""},
	}
	for _, tt := range tests {
		got := ""
		if w := snap.FindWorkload(tt.node, tt.ns, tt.name, tt.sa); w != nil {
			got = w.UID
		}
		if got != tt.want {
			t.Errorf("FindWorkload(%q, %q, %q, %q) = %q, want %q", tt.node, tt.ns, tt.name, tt.sa, got, tt.want)
		}
	}
	st.Update(func(bt *Batch) { bt.RemoveWorkload(a.UID) })
	if w := st.Snapshot().FindWorkload("", "ns", "a", ""); w != nil {
		t.Errorf("FindWorkload after removal = %v, want nil", w.UID)
	}
}

// TestWorkloadsByName: the workloads of one name in every namespace, in
// uid order, and none of a removed one.
func TestWorkloadsByName(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns", "a", "10.0.0.1")
	otherA := pod("other", "a", "10.0.0.2")
	remoteA := pod("ns", "a", "10.0.0.3")
	remoteA.UID = "c0//Pod/ns/a" // another cluster's: sorts first
	b := pod("ns", "b", "10.0.0.4")
	update(t, st, func(bt *Batch, must func(error)) {
		for _, w := range []*Workload{a, otherA, remoteA, b} {
			must(bt.InsertWorkload(w))
		}
	})
	named := func(snap *Snapshot, name string) []string {
		var uids []string
		for w := range snap.WorkloadsByName(name) {
			if w.Name != name {
				t.Errorf("WorkloadsByName(%q) yields %s, named %q", name, w.UID, w.Name)
			}
			uids = append(uids, w.UID)
		}
		return uids
	}
	snap := st.Snapshot()
	for _, tt := range []struct {
		name string
		want []string
	}{
		{"a", []string{remoteA.UID, a.UID, otherA.UID}},
		{"b", []string{b.UID}},
		{"c", nil},
		{"", nil},
	} {
		if diff := cmp.Diff(tt.want, named(snap, tt.name)); diff != "" {
			t.Errorf("WorkloadsByName(%q) (-want +got):\n%s", tt.name, diff)
		}
	}
	for range snap.WorkloadsByName("a") {
		break // stopping early is allowed
	}
	st.Update(func(bt *Batch) { bt.RemoveWorkload(a.UID) })
	if diff := cmp.Diff([]string{remoteA.UID, otherA.UID}, named(st.Snapshot(), "a")); diff != "" {
		t.Errorf("WorkloadsByName after removal (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{remoteA.UID, a.UID, otherA.UID}, named(snap, "a")); diff != "" {
		t.Errorf("WorkloadsByName of the earlier snapshot (-want +got):\n%s", diff)
	}
}

// TestRangeWorkloadNames: every workload's names, read from its record
// (a name that is its uid's suffix included), and none of a removed one.
func TestRangeWorkloadNames(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns", "a", "10.0.0.1") // name stored as the uid's suffix
	a.WorkloadName, a.ClusterID = "deploy-a", "c1"
	b := pod("other", "b", "10.0.0.2")
	b.UID = "c1//Pod/other/b-not-a-suffix"
	gone := pod("ns", "gone", "10.0.0.3")
	update(t, st, func(bt *Batch, must func(error)) {
		for _, w := range []*Workload{a, b, gone} {
			must(bt.InsertWorkload(w))
		}
	})
	st.Update(func(bt *Batch) { bt.RemoveWorkload(gone.UID) })
	var got []string
	st.Snapshot().RangeWorkloadNames(func(namespace, name, workloadName, cluster string) {
		got = append(got, namespace+"/"+name+"/"+workloadName+"/"+cluster)
	})
	if want := []string{"ns/a/deploy-a/c1", "other/b//"}; !slices.Equal(sorted(got), want) {
		t.Errorf("RangeWorkloadNames = %q, want %q", sorted(got), want)
	}
}

// TestSlotIndex: a key holds one slot inline and more in a slice of its
// own, yields them in order, and keeps nothing of the slice it was set
// from.
func TestSlotIndex(t *testing.T) {
	x := newSlotIndex[int]()
	own := false
	for k, want := range [][]int32{nil, {3}, {5, 1, 7}} {
		src := slices.Clone(want)
		x.set(k, src, &own)
		clear(src) // a caller's buffer, reused
		if got := x.slots(k, []int32{9}); !slices.Equal(got, append([]int32{9}, want...)) {
			t.Errorf("slots(%d) = %v, want %v after the prefix", k, got, want)
		}
		first := int32(-1)
		if len(want) > 0 {
			first = want[0]
		}
		if got := x.first(k); got != first {
			t.Errorf("first(%d) = %d, want %d", k, got, first)
		}
	}
	if len(x.more) != 1 {
		t.Errorf("more holds %d lists, want the one of three", len(x.more))
	}
	x.set(2, []int32{4}, &own)
	if len(x.more) != 0 || x.first(2) != 4 {
		t.Errorf("after shrinking to one: more holds %d lists, first = %d", len(x.more), x.first(2))
	}
}
