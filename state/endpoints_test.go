package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEndpointSetZero(t *testing.T) {
	var e EndpointSet
	if e.Len() != 0 || e.Has("a") || len(e.Map()) != 0 || !e.Equal(NewEndpointSet()) {
		t.Fatalf("zero set: Len %d, Has %v, Map %v", e.Len(), e.Has("a"), e.Map())
	}
	if _, ok := e.Get(""); ok {
		t.Fatal("zero set has an endpoint for the empty uid")
	}
	for range e.All() {
		t.Fatal("zero set yields an endpoint")
	}
}

// TestEndpointSetModel builds sets from random maps (uids that are prefixes
// of each other, port maps nil, empty, shared and distinct) and checks
// every accessor against the map.
func TestEndpointSetModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 2026))
	uids := []string{"", "a", "ab", "abc", "b", "c//Pod/ns/w1", "c//Pod/ns/w10", "c//Pod/ns/w2", "z"}
	shared := PortMap{80: 8080}
	for round := range 500 {
		m := map[string]Endpoint{}
		for _, uid := range uids {
			if rng.IntN(2) == 0 {
				continue
			}
			ep := Endpoint{WorkloadUID: uid, Status: HealthStatus(rng.IntN(2))}
			switch rng.IntN(4) {
			case 0: // nil
			case 1:
				ep.Ports = PortMap{}
			case 2:
				ep.Ports = shared
			default:
				ep.Ports = PortMap{uint16(rng.IntN(3)): uint16(rng.IntN(3))}
			}
			m[uid] = ep
		}
		e := NewEndpointSet(slices.Collect(maps.Values(m))...)
		what := fmt.Sprintf("round %d", round)
		if e.Len() != len(m) {
			t.Fatalf("%s: Len %d, want %d", what, e.Len(), len(m))
		}
		if diff := cmp.Diff(m, e.Map()); diff != "" {
			t.Fatalf("%s: Map (-want +got):\n%s", what, diff)
		}
		for _, uid := range append(uids, "aa", "c//Pod/ns/w3") {
			got, ok := e.Get(uid)
			want, wantOK := m[uid]
			if ok != wantOK || e.Has(uid) != wantOK || !cmp.Equal(got, want) {
				t.Fatalf("%s: Get(%q) = %v, %v; want %v, %v", what, uid, got, ok, want, wantOK)
			}
			if ok && (got.Ports == nil) != (want.Ports == nil) {
				t.Fatalf("%s: Get(%q) ports %v, want %v (nil and empty told apart)", what, uid, got.Ports, want.Ports)
			}
		}
		if got, want := slices.Collect(e.UIDs()), slices.Sorted(maps.Keys(m)); !slices.Equal(got, want) {
			t.Fatalf("%s: UIDs %q, want sorted %q", what, got, want)
		}
		if !e.Equal(NewEndpointSet(slices.Collect(maps.Values(m))...)) {
			t.Fatalf("%s: a set is not Equal to one built from the same map", what)
		}
	}
}

// TestEndpointSetSharesPortMaps checks that endpoints with equal port maps
// share one entry of the set's port list, so that a large service's set
// holds a few pointers rather than one per endpoint.
func TestEndpointSetSharesPortMaps(t *testing.T) {
	var eps []Endpoint
	for i := range 1000 {
		eps = append(eps, Endpoint{WorkloadUID: fmt.Sprintf("c//Pod/ns/w%d", i), Ports: PortMap{80: uint16(8080 + i%2)}})
	}
	e := NewEndpointSet(eps...)
	if n := len(e.t.ports); n != 2 {
		t.Fatalf("1,000 endpoints with 2 distinct port maps list %d maps", n)
	}
	if got, _ := e.Get("c//Pod/ns/w7"); got.Ports[80] != 8081 {
		t.Fatalf("w7 ports %v, want 80→8081", got.Ports)
	}
}

func TestEndpointSetEqual(t *testing.T) {
	a := NewEndpointSet(Endpoint{WorkloadUID: "a", Ports: PortMap{80: 1}})
	for _, o := range []EndpointSet{
		NewEndpointSet(Endpoint{WorkloadUID: "b", Ports: PortMap{80: 1}}),
		NewEndpointSet(Endpoint{WorkloadUID: "a", Ports: PortMap{80: 2}}),
		NewEndpointSet(Endpoint{WorkloadUID: "a", Ports: PortMap{80: 1}, Status: StatusUnhealthy}),
		NewEndpointSet(Endpoint{WorkloadUID: "a", Ports: PortMap{80: 1}}, Endpoint{WorkloadUID: "b"}),
		{},
	} {
		if a.Equal(o) || o.Equal(a) {
			t.Errorf("%v Equal %v", a.Map(), o.Map())
		}
	}
}

// TestEndpointSetAllocs checks that reading a set allocates nothing: the
// load balancer walks a service's endpoints twice per connection.
func TestEndpointSetAllocs(t *testing.T) {
	e := NewEndpointSet(Endpoint{WorkloadUID: "a"}, Endpoint{WorkloadUID: "b", Ports: PortMap{80: 1}})
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		for uid, ep := range e.All() {
			n += len(uid) + len(ep.Ports)
		}
		if ep, ok := e.Get("b"); ok && e.Has("a") {
			n += int(ep.Ports[80])
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per read", allocs)
	}
}
