package state

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"

	"github.com/gozt/gozt/rbac"
)

func TestStagedEndpointsAttach(t *testing.T) {
	st := NewStore(Config{})
	w := pod("ns", "a", "10.0.0.1")
	w.Services = map[string]PortMap{"ns/s": {80: 8080}}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(w)) })

	ep := Endpoint{WorkloadUID: w.UID, Ports: PortMap{80: 8080}}
	wantStaged := map[string]map[string]Endpoint{"ns/s": {w.UID: ep}}
	if diff := cmp.Diff(wantStaged, stagedMaps(st.Snapshot())); diff != "" {
		t.Fatalf("staged before service (-want +got):\n%s", diff)
	}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(svc("ns", "s"))) })
	snap := st.Snapshot()
	if diff := cmp.Diff(map[string]map[string]Endpoint{}, stagedMaps(snap)); diff != "" {
		t.Errorf("staged after service (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]Endpoint{w.UID: ep}, snap.ServiceByKey("ns/s").Endpoints.Map()); diff != "" {
		t.Errorf("endpoints after service (-want +got):\n%s", diff)
	}
	// Removing the service stages its endpoints again.
	st.Update(func(b *Batch) { b.RemoveService("ns/s") })
	if diff := cmp.Diff(wantStaged, stagedMaps(st.Snapshot())); diff != "" {
		t.Errorf("staged after service removal (-want +got):\n%s", diff)
	}
	// Removing the workload clears the staged entry.
	st.Update(func(b *Batch) { b.RemoveWorkload(w.UID) })
	if got := st.Snapshot().StagedEndpoints(); len(got) != 0 {
		t.Errorf("staged after workload removal = %v, want empty", got)
	}
}

// stagedMaps returns snap's staged endpoints as maps, for cmp.Diff.
func stagedMaps(snap *Snapshot) map[string]map[string]Endpoint {
	out := map[string]map[string]Endpoint{}
	for key, eps := range snap.StagedEndpoints() {
		out[key] = eps.Map()
	}
	return out
}

func TestServiceReplacementKeepsEndpoints(t *testing.T) {
	st := NewStore(Config{})
	a, b := pod("ns", "a", "10.0.0.1"), pod("ns", "b", "10.0.0.2")
	a.Services = map[string]PortMap{"ns/s": {80: 8080}}
	b.Services = map[string]PortMap{"ns/s": {80: 8081}}
	update(t, st, func(bt *Batch, must func(error)) {
		must(bt.InsertService(svc("ns", "s", vip("", "10.96.0.1"))))
		must(bt.InsertWorkload(a))
		must(bt.InsertWorkload(b))
	})
	// The new version changes the VIP and carries (ignored) endpoints of its own.
	s2 := svc("ns", "s", vip("", "10.96.0.2"))
	s2.Endpoints = NewEndpointSet(Endpoint{WorkloadUID: "bogus"})
	update(t, st, func(bt *Batch, must func(error)) { must(bt.InsertService(s2)) })
	snap := st.Snapshot()
	got := snap.ServiceByKey("ns/s")
	if diff := cmp.Diff([]string{a.UID, b.UID}, endpointUIDs(got)); diff != "" {
		t.Errorf("endpoints after replacement (-want +got):\n%s", diff)
	}
	if snap.ServiceByVIP("", ip("10.96.0.1"), "") != nil {
		t.Error("old VIP still indexed")
	}
	if snap.ServiceByVIP("", ip("10.96.0.2"), "") != got {
		t.Error("new VIP not indexed to the current service value")
	}
	if !s2.Endpoints.Has("bogus") || s2.Endpoints.Len() != 1 {
		t.Error("the store modified the caller's service")
	}
}

func TestUnhealthyEndpoints(t *testing.T) {
	healthy, sick := pod("ns", "healthy", "10.0.0.1"), pod("ns", "sick", "10.0.0.2")
	sick.Status = StatusUnhealthy
	for _, w := range []*Workload{healthy, sick} {
		w.Services = map[string]PortMap{"ns/s": {80: 80}}
	}
	withPolicy := func(hp HealthPolicy) *Service {
		s := svc("ns", "s")
		s.LoadBalancer = &LoadBalancer{HealthPolicy: hp}
		return s
	}
	tests := []struct {
		name string
		svc  *Service
		want []string
	}{
		{"no load balancer", svc("ns", "s"), []string{healthy.UID}},
		{"only healthy", withPolicy(OnlyHealthy), []string{healthy.UID}},
		{"allow all", withPolicy(AllowAll), []string{healthy.UID, sick.UID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Service first and service last must agree.
			for _, svcFirst := range []bool{true, false} {
				st := NewStore(Config{})
				update(t, st, func(b *Batch, must func(error)) {
					if svcFirst {
						must(b.InsertService(tt.svc))
					}
					must(b.InsertWorkload(healthy))
					must(b.InsertWorkload(sick))
					if !svcFirst {
						must(b.InsertService(tt.svc))
					}
				})
				if diff := cmp.Diff(tt.want, endpointUIDs(st.Snapshot().ServiceByKey("ns/s"))); diff != "" {
					t.Errorf("svcFirst=%v endpoints (-want +got):\n%s", svcFirst, diff)
				}
			}
		})
	}
	// Switching the health policy re-derives endpoints both ways, and a
	// workload turning unhealthy drops out.
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertService(withPolicy(AllowAll)))
		must(b.InsertWorkload(healthy))
		must(b.InsertWorkload(sick))
	})
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(withPolicy(OnlyHealthy))) })
	if diff := cmp.Diff([]string{healthy.UID}, endpointUIDs(st.Snapshot().ServiceByKey("ns/s"))); diff != "" {
		t.Errorf("after OnlyHealthy (-want +got):\n%s", diff)
	}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(withPolicy(AllowAll))) })
	if diff := cmp.Diff([]string{healthy.UID, sick.UID}, endpointUIDs(st.Snapshot().ServiceByKey("ns/s"))); diff != "" {
		t.Errorf("after AllowAll again (-want +got):\n%s", diff)
	}
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertService(withPolicy(OnlyHealthy))) })
	nowSick := *healthy
	nowSick.Status = StatusUnhealthy
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(&nowSick)) })
	if got := endpointUIDs(st.Snapshot().ServiceByKey("ns/s")); len(got) != 0 {
		t.Errorf("after workload turned unhealthy = %v, want none", got)
	}
}

func TestRemoveByName(t *testing.T) {
	st := NewStore(Config{})
	w := pod("ns", "a", "10.0.0.1")
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(w))
		must(b.InsertService(svc("ns", "s")))
		must(b.InsertPolicy(policy("ns", "p", rbac.Namespace)))
	})
	tests := []struct {
		name string
		want bool
	}{
		{w.UID, true},
		{w.UID, false},
		{"ns/s", true},
		{"ns/p", true},
		{"ns/p", false},
		{"unknown", false},
	}
	for _, tt := range tests {
		var got bool
		st.Update(func(b *Batch) { got = b.Remove(tt.name) })
		if got != tt.want {
			t.Errorf("Remove(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
	ws, ss, ps := st.Snapshot().Counts()
	if ws+ss+ps != 0 {
		t.Errorf("Counts after removals = %d, %d, %d, want zeros", ws, ss, ps)
	}
	if got := st.Snapshot().NamespacePolicies("ns"); len(got) != 0 {
		t.Errorf("NamespacePolicies after removal = %v", keys(got))
	}
}

func TestRemoveNamePrecedence(t *testing.T) {
	// A name that is both a workload uid and a service key removes the
	// workload first (SPEC §5.3).
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(&Workload{UID: "ns/s", Namespace: "ns"}))
		must(b.InsertService(svc("ns", "s")))
	})
	st.Update(func(b *Batch) { b.Remove("ns/s") })
	snap := st.Snapshot()
	if snap.WorkloadByUID("ns/s") != nil || snap.ServiceByKey("ns/s") == nil {
		t.Fatalf("Remove removed the wrong resource")
	}
}

func TestPolicyIndex(t *testing.T) {
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertPolicy(policy("ns1", "b", rbac.Namespace)))
		must(b.InsertPolicy(policy("ns1", "a", rbac.Namespace)))
		must(b.InsertPolicy(policy("ns2", "c", rbac.Namespace)))
		must(b.InsertPolicy(policy("istio-system", "g", rbac.Global)))
		must(b.InsertPolicy(policy("ns1", "sel", rbac.WorkloadSelector)))
	})
	snap := st.Snapshot()
	checks := []struct {
		what string
		got  []*rbac.Policy
		want []string
	}{
		{"ns1", snap.NamespacePolicies("ns1"), []string{"ns1/a", "ns1/b"}},
		{"ns2", snap.NamespacePolicies("ns2"), []string{"ns2/c"}},
		{"ns3", snap.NamespacePolicies("ns3"), []string{}},
		{"global", snap.GlobalPolicies(), []string{"istio-system/g"}},
		{"all", snap.Policies(), []string{"istio-system/g", "ns1/a", "ns1/b", "ns1/sel", "ns2/c"}},
	}
	for _, c := range checks {
		if diff := cmp.Diff(c.want, keys(c.got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.what, diff)
		}
	}
	if p := snap.Policy("ns1/sel"); p == nil || p.Scope != rbac.WorkloadSelector {
		t.Errorf("Policy(ns1/sel) = %v", p)
	}
}

// TestPolicyScopeChange is TESTPLAN S3: changing an existing policy's scope
// (or namespace) must remove its old index entry, leaving the indexes equal
// to a from-scratch rebuild.
func TestPolicyScopeChange(t *testing.T) {
	steps := []*rbac.Policy{
		policy("ns1", "p", rbac.Namespace),
		policy("ns1", "p", rbac.WorkloadSelector),
		policy("ns1", "p", rbac.Global),
		policy("ns1", "p", rbac.Namespace),
		policy("ns1", "p", rbac.Global),
		policy("ns1", "p", rbac.WorkloadSelector),
	}
	others := []*rbac.Policy{policy("ns1", "other", rbac.Namespace), policy("x", "g", rbac.Global)}
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		for _, p := range others {
			must(b.InsertPolicy(p))
		}
	})
	for i, p := range steps {
		update(t, st, func(b *Batch, must func(error)) { must(b.InsertPolicy(p)) })
		fresh := NewStore(Config{})
		update(t, fresh, func(b *Batch, must func(error)) {
			for _, o := range others {
				must(b.InsertPolicy(o))
			}
			must(b.InsertPolicy(p))
		})
		got, want := st.Snapshot(), fresh.Snapshot()
		for _, ns := range []string{"ns1", "x"} {
			if diff := cmp.Diff(keys(want.NamespacePolicies(ns)), keys(got.NamespacePolicies(ns))); diff != "" {
				t.Errorf("step %d (%v): NamespacePolicies(%s) (-rebuild +incremental):\n%s", i, p.Scope, ns, diff)
			}
		}
		if diff := cmp.Diff(keys(want.GlobalPolicies()), keys(got.GlobalPolicies())); diff != "" {
			t.Errorf("step %d (%v): GlobalPolicies (-rebuild +incremental):\n%s", i, p.Scope, diff)
		}
	}
	// Within one batch too: insert as Namespace, then change to selector.
	st2 := NewStore(Config{})
	update(t, st2, func(b *Batch, must func(error)) {
		must(b.InsertPolicy(policy("ns1", "p", rbac.Namespace)))
		must(b.InsertPolicy(policy("ns1", "p", rbac.WorkloadSelector)))
	})
	if got := st2.Snapshot().NamespacePolicies("ns1"); len(got) != 0 {
		t.Errorf("same-batch scope change left %v", keys(got))
	}
	// A namespace change of a namespace-scoped policy is a different key,
	// so it is a different policy; the old one stays until removed.
}

func TestSnapshotIsolation(t *testing.T) {
	st := NewStore(Config{})
	w := pod("ns", "a", "10.0.0.1")
	w.Services = map[string]PortMap{"ns/s": {80: 80}}
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(w))
		must(b.InsertService(svc("ns", "s", vip("", "10.96.0.1"))))
		must(b.InsertPolicy(policy("ns", "p", rbac.Namespace)))
	})
	old := st.Snapshot()
	before := contents(t, old)
	update(t, st, func(b *Batch, must func(error)) {
		w2 := pod("ns", "b", "10.0.0.2")
		w2.Services = map[string]PortMap{"ns/s": {80: 81}}
		must(b.InsertWorkload(w2))
		b.RemoveWorkload(w.UID)
		must(b.InsertService(svc("ns", "s", vip("", "10.96.0.9"))))
		must(b.InsertPolicy(policy("ns", "p", rbac.Global)))
		must(b.InsertPolicy(policy("ns", "q", rbac.Namespace)))
	})
	update(t, st, func(b *Batch, must func(error)) {
		b.Reset()
		must(b.InsertWorkload(pod("other", "c", "10.0.0.1")))
	})
	if diff := cmp.Diff(before, contents(t, old)); diff != "" {
		t.Errorf("old snapshot changed (-before +after):\n%s", diff)
	}
	if got := old.WorkloadByIP("", ip("10.0.0.1")); got == nil || got.UID != w.UID {
		t.Errorf("old WorkloadByIP = %v", got)
	}
	if got := old.ServiceByVIP("", ip("10.96.0.1"), ""); got == nil || got.Endpoints.Len() != 1 {
		t.Errorf("old ServiceByVIP = %v", got)
	}
	if diff := cmp.Diff([]string{"ns/p"}, keys(old.NamespacePolicies("ns"))); diff != "" {
		t.Errorf("old NamespacePolicies (-want +got):\n%s", diff)
	}
	if old.Generation() != 1 || st.Snapshot().Generation() != 3 {
		t.Errorf("generations = %d, %d, want 1, 3", old.Generation(), st.Snapshot().Generation())
	}
}

func TestReset(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns", "a", "10.0.0.1")
	a.Services = map[string]PortMap{"ns/s": {80: 80}}
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(a))
		must(b.InsertService(svc("ns", "s", vip("", "10.96.0.1"))))
		must(b.InsertPolicy(policy("ns", "p", rbac.Global)))
	})
	update(t, st, func(b *Batch, must func(error)) {
		b.Reset()
		must(b.InsertService(svc("ns", "s2", vip("", "10.96.0.2"))))
	})
	snap := st.Snapshot()
	if ws, ss, ps := snap.Counts(); ws != 0 || ss != 1 || ps != 0 {
		t.Errorf("Counts = %d, %d, %d, want 0, 1, 0", ws, ss, ps)
	}
	if snap.WorkloadByIP("", ip("10.0.0.1")) != nil || snap.ServiceByVIP("", ip("10.96.0.1"), "") != nil ||
		len(snap.GlobalPolicies()) != 0 || len(snap.StagedEndpoints()) != 0 || len(snap.ServicesByHostname("s")) != 0 {
		t.Error("Reset left index entries behind")
	}
	if snap.ServiceByVIP("", ip("10.96.0.2"), "") == nil {
		t.Error("service inserted after Reset is not indexed")
	}
}

func TestValidation(t *testing.T) {
	gw := func(g GatewayAddress) *GatewayAddress { return &g }
	badWorkloads := map[string]*Workload{
		"nil":             nil,
		"empty uid":       {Namespace: "ns"},
		"invalid address": {UID: "u", Addresses: []netip.Addr{{}}},
		"protocol":        {UID: "u", Protocol: 2},
		"workload type":   {UID: "u", WorkloadType: 9},
		"status":          {UID: "u", Status: 2},
		"network mode":    {UID: "u", NetworkMode: 2},
		"app tunnel":      {UID: "u", ApplicationTunnel: &ApplicationTunnel{Protocol: 5}},
		"empty waypoint":  {UID: "u", Waypoint: gw(GatewayAddress{})},
		"double waypoint": {UID: "u", Waypoint: gw(GatewayAddress{Hostname: &NamespacedHostname{"a", "b"}, Address: &NetworkAddress{"", ip("1.1.1.1")}})},
		"bad service key": {UID: "u", Services: map[string]PortMap{"noslash": nil}},
	}
	badServices := map[string]*Service{
		"nil":            nil,
		"no namespace":   {Hostname: "h"},
		"no hostname":    {Namespace: "ns"},
		"slash in ns":    {Namespace: "a/b", Hostname: "h"},
		"bad vip":        {Namespace: "ns", Hostname: "h", VIPs: []NetworkAddress{{}}},
		"bad cidr":       {Namespace: "ns", Hostname: "h", CIDRVIPs: []NetworkPrefix{{}}},
		"lb scope":       {Namespace: "ns", Hostname: "h", LoadBalancer: &LoadBalancer{RoutingPreference: []LBScope{0}}},
		"lb mode":        {Namespace: "ns", Hostname: "h", LoadBalancer: &LoadBalancer{Mode: 7}},
		"visibility":     {Namespace: "ns", Hostname: "h", Visibility: 3},
		"weighted empty": {Namespace: "ns", Hostname: "h", WeightedWaypoints: []WeightedWaypoint{{Weight: 1}}},
	}
	badPolicies := map[string]*rbac.Policy{
		"nil":     nil,
		"no name": {Namespace: "ns"},
		"scope":   {Name: "p", Namespace: "ns", Scope: 9},
	}
	st := NewStore(Config{})
	calls := 0
	st.cfg.OnUpdate = func(_, _ *Snapshot) { calls++ }
	st.Update(func(b *Batch) {
		for name, w := range badWorkloads {
			if err := b.InsertWorkload(w); !errors.Is(err, ErrInvalid) {
				t.Errorf("InsertWorkload(%s) = %v, want ErrInvalid", name, err)
			}
		}
		for name, s := range badServices {
			if err := b.InsertService(s); !errors.Is(err, ErrInvalid) {
				t.Errorf("InsertService(%s) = %v, want ErrInvalid", name, err)
			}
		}
		for name, p := range badPolicies {
			if err := b.InsertPolicy(p); !errors.Is(err, ErrInvalid) {
				t.Errorf("InsertPolicy(%s) = %v, want ErrInvalid", name, err)
			}
		}
	})
	if calls != 0 || st.Snapshot().Generation() != 0 {
		t.Errorf("rejected inserts published a snapshot (calls=%d)", calls)
	}
}

func TestOnUpdate(t *testing.T) {
	type call struct{ Prev, Next uint64 }
	var calls []call
	var st *Store
	st = NewStore(Config{OnUpdate: func(prev, next *Snapshot) {
		if st.Snapshot() != next {
			t.Error("OnUpdate called before the snapshot was published")
		}
		calls = append(calls, call{prev.Generation(), next.Generation()})
	}})
	st.Update(func(b *Batch) {
		_ = b.InsertWorkload(pod("ns", "a", "10.0.0.1"))
		_ = b.InsertWorkload(pod("ns", "b", "10.0.0.2"))
	})
	st.Update(func(b *Batch) { b.RemoveWorkload("does-not-exist") }) // no change: no publish
	st.Update(func(b *Batch) { b.RemoveWorkload(pod("ns", "a").UID) })
	if diff := cmp.Diff([]call{{0, 1}, {1, 2}}, calls); diff != "" {
		t.Errorf("OnUpdate calls (-want +got):\n%s", diff)
	}
}

func TestChanges(t *testing.T) {
	st := NewStore(Config{})
	a := pod("ns", "a", "10.0.0.1")
	a.Services = map[string]PortMap{"ns/s": {80: 80}}
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertWorkload(a))
		must(b.InsertWorkload(pod("ns", "b")))
		must(b.InsertService(svc("ns", "t")))
		must(b.InsertPolicy(policy("ns", "p", rbac.Global)))
	})
	want := Changes{
		Workloads: []string{a.UID, pod("ns", "b").UID},
		Services:  []string{"ns/s", "ns/t"}, // ns/s only staged
		Policies:  []string{"ns/p"},
	}
	if diff := cmp.Diff(want, st.Snapshot().Changes()); diff != "" {
		t.Errorf("Changes (-want +got):\n%s", diff)
	}
	update(t, st, func(b *Batch, must func(error)) {
		b.RemovePolicy("ns/p")
		must(b.InsertService(svc("ns", "s")))
	})
	want = Changes{Services: []string{"ns/s"}, Policies: []string{"ns/p"}}
	if diff := cmp.Diff(want, st.Snapshot().Changes()); diff != "" {
		t.Errorf("Changes after removal (-want +got):\n%s", diff)
	}
	update(t, st, func(b *Batch, must func(error)) {
		b.RemoveWorkload(a.UID)
		b.Reset()
		must(b.InsertPolicy(policy("ns", "q", rbac.Global)))
	})
	want = Changes{Reset: true, Services: []string{}, Workloads: []string{}, Policies: []string{"ns/q"}}
	if diff := cmp.Diff(want, st.Snapshot().Changes(), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Changes after reset (-want +got):\n%s", diff)
	}
}

func TestBatchUseAfterUpdatePanics(t *testing.T) {
	st := NewStore(Config{})
	var kept *Batch
	st.Update(func(b *Batch) { kept = b })
	defer func() {
		if recover() == nil {
			t.Error("using a Batch after Update did not panic")
		}
	}()
	_ = kept.InsertWorkload(pod("ns", "a"))
}

func TestStoreDoesNotAliasCallerAddresses(t *testing.T) {
	st := NewStore(Config{})
	w := pod("ns", "a", "::ffff:10.0.0.1")
	update(t, st, func(b *Batch, must func(error)) { must(b.InsertWorkload(w)) })
	if !w.Addresses[0].Is4In6() {
		t.Error("the store unmapped the caller's slice in place")
	}
	if got := st.Snapshot().WorkloadByUID(w.UID).Addresses[0]; got != ip("10.0.0.1") {
		t.Errorf("stored address = %v, want 10.0.0.1", got)
	}
}

// TestConcurrentReaders runs lookups while a writer churns; run with -race.
func TestConcurrentReaders(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := NewStore(Config{})
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				snap := st.Snapshot()
				w := snap.WorkloadByIP("", ip("10.0.0.1"))
				s := snap.ServiceByVIP("", ip("10.96.0.1"), "ns")
				if s != nil {
					for uid, ep := range s.Endpoints.All() {
						if ep.WorkloadUID != uid || snap.WorkloadByUID(uid) == nil {
							t.Errorf("endpoint %s without its workload in the same snapshot", uid)
						}
					}
				}
				_ = w
				_ = snap.NamespacePolicies("ns")
				_ = contents(t, snap)
			}
		}()
	}
	for i := 0; i < 300; i++ {
		update(t, st, func(b *Batch, must func(error)) {
			w := pod("ns", fmt.Sprintf("w%d", i%7), "10.0.0.1")
			w.Services = map[string]PortMap{"ns/s": {80: uint16(i)}}
			must(b.InsertWorkload(w))
			if i%3 == 0 {
				b.RemoveWorkload(pod("ns", fmt.Sprintf("w%d", (i+3)%7)).UID)
			}
			must(b.InsertService(svc("ns", "s", vip("", "10.96.0.1"))))
			must(b.InsertPolicy(policy("ns", "p", rbac.Scope(i%3))))
		})
	}
	stop.Store(true)
	wg.Wait()
}
