package xds

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// sameString reports whether a and b share their bytes (one allocation).
func sameString(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}

func TestInternerSharesEqualStrings(t *testing.T) {
	in := newInterner()
	a := string([]byte("ns-1"))
	b := string([]byte("ns-1"))
	if sameString(a, b) {
		t.Fatal("test strings already share memory")
	}
	if got := in.str(a); !sameString(got, a) {
		t.Error("first string was not kept")
	}
	if got := in.str(b); !sameString(got, a) || got != "ns-1" {
		t.Error("equal string did not come back as the first copy")
	}
	if got := in.str("ns-2"); got != "ns-2" {
		t.Errorf("str(ns-2) = %q", got)
	}
	ss := in.strs([]string{string([]byte("ns-1")), "x"})
	if !sameString(ss[0], a) || ss[1] != "x" {
		t.Errorf("strs = %q, want the interned ns-1 and x", ss)
	}
	var none interner
	if got := none.str(b); !sameString(got, b) {
		t.Error("nil interner changed its argument")
	}
}

// TestDecodeSharesStringsAcrossWorkloads checks that the workloads of one
// push share the strings they have in common, and that the result equals
// a conversion without interning.
func TestDecodeSharesStringsAcrossWorkloads(t *testing.T) {
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL}
	var want []*state.Workload
	for i := range 3 {
		pw := &workloadapi.Workload{
			Uid: fmt.Sprintf("Kubernetes//Pod/ns/p%d", i), Name: fmt.Sprintf("p%d", i), Namespace: "ns",
			Addresses: [][]byte{{10, 0, 0, byte(i)}}, ServiceAccount: "sa", Node: "node-1",
			CanonicalName: "app", CanonicalRevision: "v1", WorkloadName: "app", ClusterId: "c1",
			Locality:              &workloadapi.Locality{Region: "r", Zone: "z"},
			AuthorizationPolicies: []string{"ns/allow"},
			Services: map[string]*workloadapi.PortList{
				"ns/svc.ns.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
			},
		}
		w, err := WorkloadFromProto(proto.Clone(pw).(*workloadapi.Workload))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, w)
		payload, err := anypb.New(WorkloadAddress(pw))
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: pw.GetUid(), Version: "v1", Resource: payload})
	}
	var got []*state.Workload
	if rejects := decodeEach(resp, newDecodeCache(), func(d decoded) { got = append(got, d.w) }); len(rejects) != 0 {
		t.Fatalf("rejects: %v", rejects)
	}
	if diff := cmp.Diff(want, got, cmpNetip); diff != "" {
		t.Fatalf("decoded workloads differ (-want +got):\n%s", diff)
	}
	a, b := got[0], got[2]
	for _, f := range []struct {
		name string
		x, y string
	}{
		{"namespace", a.Namespace, b.Namespace},
		{"service account", a.ServiceAccount, b.ServiceAccount},
		{"node", a.Node, b.Node},
		{"canonical name", a.CanonicalName, b.CanonicalName},
		{"canonical revision", a.CanonicalRevision, b.CanonicalRevision},
		{"workload name", a.WorkloadName, b.WorkloadName},
		{"cluster", a.ClusterID, b.ClusterID},
		{"region", a.Locality.Region, b.Locality.Region},
		{"policy", a.AuthorizationPolicies[0], b.AuthorizationPolicies[0]},
	} {
		if !sameString(f.x, f.y) {
			t.Errorf("%s: workloads hold separate copies of %q", f.name, f.x)
		}
	}
	for ka := range a.Services {
		for kb := range b.Services {
			if !sameString(ka, kb) {
				t.Errorf("service key %q not shared", ka)
			}
		}
	}
	if sameString(a.UID, b.UID) {
		t.Error("distinct uids share memory")
	}
}

// TestHandleResponseConsumesAndAppliesOnce checks what releasing a push's
// memory while it is decoded must not change: every resource of the
// response, valid ones and rejected ones, is handled; the valid ones (and the
// removals) reach the store in one published snapshot; and the response's
// resource list is cleared.
func TestHandleResponseConsumesAndAppliesOnce(t *testing.T) {
	var published int
	st := state.NewStore(state.Config{OnUpdate: func(_, _ *state.Snapshot) { published++ }})
	c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "1"}
	for i := range n {
		uid := fmt.Sprintf("Kubernetes//Pod/ns-%d/p%d", i%7, i)
		pw := &workloadapi.Workload{Uid: uid, Name: fmt.Sprintf("p%d", i), Namespace: fmt.Sprintf("ns-%d", i%7),
			Addresses: [][]byte{{10, 1, byte(i >> 8), byte(i)}}, Node: "node-1"}
		payload, err := anypb.New(WorkloadAddress(pw))
		if err != nil {
			t.Fatal(err)
		}
		name := uid
		if i == 17 {
			name = "not-the-uid"
		}
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: name, Version: "v1", Resource: payload})
	}
	// A repeated name is rejected as well, and does not replace the first.
	resp.Resources = append(resp.Resources, resp.Resources[3])
	req, ack := c.handleResponse(resp, nil)
	if ack {
		t.Fatal("push with two bad resources was ACKed")
	}
	msg := req.GetErrorDetail().GetMessage()
	if !strings.Contains(msg, "not-the-uid") || !strings.Contains(msg, "duplicate resource name") {
		t.Errorf("NACK message %q does not name both rejected resources", msg)
	}
	if published != 1 {
		t.Errorf("push published %d snapshots, want 1", published)
	}
	if got := len(st.Snapshot().Workloads()); got != n-1 {
		t.Errorf("store holds %d workloads, want %d", got, n-1)
	}
	if got := c.held[AddressTypeURL].Len(); got != n-1 {
		t.Errorf("client lists %d held resources, want %d", got, n-1)
	}
	for i, r := range resp.GetResources() {
		if r != nil {
			t.Fatalf("resource %d still referenced by the response after handling", i)
		}
	}
}
