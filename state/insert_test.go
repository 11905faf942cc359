package state

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestInsertWorkloadShares: the store keeps an inserted workload's fields
// with its addresses (its waypoint's too) unmapped, leaves the caller's workload as it was, and
// never modifies what it shares with others: two workloads with one
// Services map are both endpoints, and removing one leaves the other's map
// and endpoint as they were.
func TestInsertWorkloadShares(t *testing.T) {
	st := NewStore(Config{})
	shared := map[string]PortMap{"ns/web": {80: 8080}}
	mapped := [][]string{{"::ffff:10.0.0.1"}, {"10.0.0.2"}}
	var ws []*Workload
	for i, m := range mapped {
		w := pod("ns", fmt.Sprintf("p%d", i), m...)
		w.Services = shared
		ws = append(ws, w)
	}
	ws[0].Waypoint = &GatewayAddress{Address: &NetworkAddress{"", ip("::ffff:10.0.0.9")}, HBONEMTLSPort: 15008}
	update(t, st, func(b *Batch, must func(error)) {
		must(b.InsertService(svc("ns", "web")))
		for _, w := range ws {
			must(b.InsertWorkload(w))
		}
	})
	if got := ws[0].Addresses[0]; got != ip("::ffff:10.0.0.1") {
		t.Errorf("the caller's address became %v", got)
	}
	if got := ws[0].Waypoint.Address.Address; got != ip("::ffff:10.0.0.9") {
		t.Errorf("the caller's waypoint address became %v", got)
	}
	s := st.Snapshot()
	want := *ws[0]
	want.Addresses = []netip.Addr{ip("10.0.0.1")}
	want.Waypoint = &GatewayAddress{Address: &NetworkAddress{"", ip("10.0.0.9")}, HBONEMTLSPort: 15008}
	if got := s.WorkloadByUID(ws[0].UID); !same(got, &want) {
		t.Fatalf("stored workload = %+v, want %+v", got, &want)
	}
	if got := s.WorkloadByIP("", ip("10.0.0.1")); got == nil || got.UID != ws[0].UID {
		t.Errorf("WorkloadByIP(10.0.0.1) = %v, want the unmapped workload", uidOf(got))
	}
	if got := s.WorkloadByUID(ws[1].UID).Services; reflect.ValueOf(got).UnsafePointer() != reflect.ValueOf(shared).UnsafePointer() {
		t.Error("the two workloads' equal services maps are not one")
	}
	if got, want := endpointUIDs(s.ServiceByKey("ns/web")), sorted([]string{ws[0].UID, ws[1].UID}); !cmp.Equal(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
	update(t, st, func(b *Batch, must func(error)) { b.RemoveWorkload(ws[0].UID) })
	s = st.Snapshot()
	if got, want := endpointUIDs(s.ServiceByKey("ns/web")), []string{ws[1].UID}; !cmp.Equal(got, want) {
		t.Errorf("endpoints after removal = %v, want %v", got, want)
	}
	if diff := cmp.Diff(map[string]PortMap{"ns/web": {80: 8080}}, s.WorkloadByUID(ws[1].UID).Services); diff != "" {
		t.Errorf("shared services map changed (-want +got):\n%s", diff)
	}
	bad := &Workload{}
	update(t, st, func(b *Batch, _ func(error)) {
		if b.InsertWorkload(bad) == nil {
			t.Error("InsertWorkload accepted a workload without a uid")
		}
	})
}

// TestReserve: a batch told to expect many workloads gives the same state
// as one that is not, and leaves the snapshot it started from unchanged.
func TestReserve(t *testing.T) {
	build := func(reserve bool) (*Snapshot, *Snapshot) {
		st := NewStore(Config{})
		update(t, st, func(b *Batch, must func(error)) {
			for i := range 20 {
				must(b.InsertWorkload(pod("ns", fmt.Sprintf("old%d", i), fmt.Sprintf("10.0.0.%d", i))))
			}
		})
		before := st.Snapshot()
		update(t, st, func(b *Batch, must func(error)) {
			if reserve {
				b.Reserve(100)
			}
			b.RemoveWorkload(pod("ns", "old0").UID)
			for i := range 100 {
				must(b.InsertWorkload(pod("ns", fmt.Sprintf("new%d", i), fmt.Sprintf("10.1.0.%d", i))))
			}
		})
		return before, st.Snapshot()
	}
	before, with := build(true)
	_, without := build(false)
	if n, _, _ := before.Counts(); n != 20 || before.WorkloadByIP("", ip("10.1.0.1")) != nil || before.WorkloadByIP("", ip("10.0.0.0")) == nil {
		t.Errorf("the batch changed its base snapshot: %d workloads", n)
	}
	if diff := cmp.Diff(without.Workloads(), with.Workloads(), cmpOpts); diff != "" {
		t.Errorf("workloads differ with Reserve (-without +with):\n%s", diff)
	}
	for i := range 100 {
		a := ip(fmt.Sprintf("10.1.0.%d", i))
		if with.WorkloadByIP("", a) == nil || with.FindWorkload("", "ns", fmt.Sprintf("new%d", i), "") == nil {
			t.Fatalf("workload new%d not indexed by IP and name", i)
		}
	}
	if with.WorkloadByIP("", ip("10.0.0.0")) != nil {
		t.Error("removed workload still indexed")
	}
	if diff := cmp.Diff(without.Changes(), with.Changes()); diff != "" {
		t.Errorf("changes differ with Reserve (-without +with):\n%s", diff)
	}
}
