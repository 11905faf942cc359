package xds

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// generalDecode is the general path of decodeResource for an Address: it
// returns the workload, or nil if the bytes do not decode and convert to
// one.
func generalDecode(b []byte) *state.Workload {
	var a workloadapi.Address
	if proto.Unmarshal(b, &a) != nil {
		return nil
	}
	w, _, err := addressFromProto(&a, nil)
	if err != nil {
		return nil
	}
	return w
}

// checkFast decodes b with the fast decoder under the resource name name
// and, if it accepts, checks that the general path returns the same
// workload. It reports whether the fast decoder accepted.
func checkFast(t *testing.T, c *decodeCache, b []byte, name string) bool {
	t.Helper()
	got, ok := c.workload(b, name)
	if !ok {
		return false
	}
	want := generalDecode(b)
	if want == nil {
		t.Fatalf("fast decoder accepted what the general path refuses: %x", b)
	}
	if want.UID != name {
		t.Fatalf("fast decoder accepted uid %q under resource name %q", want.UID, name)
	}
	if diff := cmp.Diff(want, got, cmpNetip); diff != "" {
		t.Fatalf("fast decoder differs (-general +fast):\n%s", diff)
	}
	return true
}

func marshal(t testing.TB, m proto.Message, deterministic bool) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: deterministic}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFastDecodeMatchesGeneral: every generated workload, as istiod
// encodes it, is read by the fast decoder, and equals what
// proto.Unmarshal and workloadFromProto make of it.
func TestFastDecodeMatchesGeneral(t *testing.T) {
	r := newGen(11)
	c := newDecodeCache()
	for i := range 500 {
		w := r.workload()
		b := marshal(t, WorkloadAddress(WorkloadToProto(w)), i%2 == 0)
		if !checkFast(t, c, b, w.UID) {
			t.Fatalf("fast decoder refused generated workload %d: %+v", i, w)
		}
	}
}

// field appends one length-delimited field to b.
func field(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// address wraps Workload message bytes in an Address.
func address(w []byte) []byte { return field(nil, addrWorkload, w) }

func TestFastDecodeEdgeCases(t *testing.T) {
	base := &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns/p", Name: "p", Namespace: "ns", Addresses: [][]byte{{10, 0, 0, 1}},
		Services: map[string]*workloadapi.PortList{
			"ns/a.ns.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
			"ns/b.ns.svc.cluster.local": {},
		},
		Waypoint: &workloadapi.GatewayAddress{
			Destination:   &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp"}},
			HboneMtlsPort: 15008,
		},
		Capacity: wrapperspb.UInt32(0),
		Locality: &workloadapi.Locality{Region: "r"},
	}
	wb := marshal(t, base, true)
	wp := marshal(t, base.Waypoint, true)
	const name = "Kubernetes//Pod/ns/p"
	cases := []struct {
		name   string
		b      []byte
		accept bool
	}{
		{"as encoded", address(wb), true},
		{"a later name replaces the first", address(field(wb, wName, []byte("q"))), true},
		// Locality and capacity come between the services entries.
		{"services entries apart", address(field(wb, wServices, field(nil, 1, []byte("ns/c")))), true},
		{"a later services entry replaces one", address(field(wb, wServices, field(nil, 1, []byte("ns/a.ns.svc.cluster.local")))), true},
		{"unknown fields", address(field(field(wb, 99, []byte("x")), 98, nil)), true},
		{"unknown field in the address", field(address(wb), 7, []byte("x")), true},
		// proto.Unmarshal merges a repeated message field: left to it.
		{"waypoint twice", address(field(wb, wWaypoint, wp)), false},
		{"workload twice", append(address(wb), address(wb)...), false},
		{"service", field(nil, addrService, nil), false},
		{"no workload", nil, false},
		{"extension", address(field(wb, wExtensions, nil)), false},
		{"invalid UTF-8", address(field(wb, wNamespace, []byte{0xff})), false},
		{"uid not the name", address(field(wb, wUID, []byte("other"))), false},
		{"bad address", address(field(wb, wAddresses, []byte{1, 2, 3})), false},
		{"bad service key", address(field(wb, wServices, field(nil, 1, []byte("nohost")))), false},
		{"wrong wire type", address(protowire.AppendVarint(protowire.AppendTag(wb, wName, protowire.VarintType), 1)), false},
		{"truncated", address(wb)[:len(wb)/2], false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := checkFast(t, newDecodeCache(), tc.b, name); got != tc.accept {
				t.Errorf("fast decoder accepted = %v, want %v", got, tc.accept)
			}
		})
	}
}

// TestFastDecodeShares checks that workloads of one push share equal
// services maps, gateways and policy lists, and that a pod's name shares
// its uid's bytes.
func TestFastDecodeShares(t *testing.T) {
	c := newDecodeCache()
	var ws []*state.Workload
	for _, name := range []string{"p1", "p2"} {
		uid := "Kubernetes//Pod/ns/" + name
		b := marshal(t, WorkloadAddress(&workloadapi.Workload{
			Uid: uid, Name: name, Namespace: "ns",
			Services: map[string]*workloadapi.PortList{
				"ns/a.ns.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
			},
			AuthorizationPolicies: []string{"ns/allow"},
			Waypoint: &workloadapi.GatewayAddress{
				Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp"}},
			},
		}), true)
		if !checkFast(t, c, b, uid) {
			t.Fatal("fast decoder refused")
		}
		w, _ := c.workload(b, uid)
		if !sameString(w.Name, w.UID[len(w.UID)-len(w.Name):]) {
			t.Errorf("name %q does not share the uid's bytes", w.Name)
		}
		ws = append(ws, w)
	}
	a, b := ws[0], ws[1]
	if reflect.ValueOf(a.Services).UnsafePointer() != reflect.ValueOf(b.Services).UnsafePointer() {
		t.Error("equal services maps are not shared")
	}
	if a.Waypoint != b.Waypoint {
		t.Error("equal waypoints are not shared")
	}
	if &a.AuthorizationPolicies[0] != &b.AuthorizationPolicies[0] {
		t.Error("equal policy lists are not shared")
	}
}

// FuzzFastWorkloadDecode: whatever the fast decoder accepts, the general
// path accepts too and converts to the same workload.
func FuzzFastWorkloadDecode(f *testing.F) {
	r := newGen(12)
	for range 20 {
		f.Add(marshal(f, WorkloadAddress(WorkloadToProto(r.workload())), true))
	}
	f.Add(address(field(nil, wUID, []byte("u"))))
	f.Fuzz(func(t *testing.T, b []byte) {
		name := "u"
		if w := generalDecode(b); w != nil {
			name = w.UID
		}
		checkFast(t, newDecodeCache(), b, name)
	})
}
