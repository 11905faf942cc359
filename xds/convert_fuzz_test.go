package xds

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/state"
)

// seedBytes marshals seed messages for the fuzzers' corpora.
func seedBytes(f *testing.F, msgs ...proto.Message) {
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzWorkloadFromProto feeds arbitrary bytes, as istiod could send them,
// through decoding and conversion. Properties: no panic; a workload that
// converts is accepted by the store; and it survives a round trip through
// WorkloadToProto unchanged.
func FuzzWorkloadFromProto(f *testing.F) {
	r := newGen(3)
	for range 20 {
		seedBytes(f, WorkloadToProto(r.workload()))
	}
	seedBytes(f,
		&workloadapi.Workload{Uid: "u", Addresses: [][]byte{{1, 2, 3, 4, 5}}},
		&workloadapi.Workload{Uid: "u", TunnelProtocol: workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS},
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		var p workloadapi.Workload
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		w, err := WorkloadFromProto(&p)
		in := newInterner()
		wi, erri := workloadFromProtoIn(&p, in)
		if (err == nil) != (erri == nil) {
			t.Fatalf("interned conversion error %v, plain %v", erri, err)
		}
		if err != nil {
			return
		}
		if diff := cmp.Diff(w, wi, cmpNetip); diff != "" {
			t.Fatalf("interned conversion differs (-plain +interned):\n%s", diff)
		}
		st := state.NewStore(state.Config{})
		st.Update(func(b *state.Batch) {
			if err := b.InsertWorkload(w); err != nil {
				t.Fatalf("store refused converted workload: %v", err)
			}
		})
		again, err := WorkloadFromProto(WorkloadToProto(w))
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if diff := cmp.Diff(w, again, cmpNetip); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

// FuzzAddressFromProto is FuzzWorkloadFromProto for whole Address
// resources, services included.
func FuzzAddressFromProto(f *testing.F) {
	r := newGen(4)
	for range 10 {
		seedBytes(f, WorkloadAddress(WorkloadToProto(r.workload())), ServiceAddress(ServiceToProto(r.service())))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var a workloadapi.Address
		if proto.Unmarshal(b, &a) != nil {
			return
		}
		w, s, err := AddressFromProto(&a)
		if err != nil {
			return
		}
		st := state.NewStore(state.Config{})
		st.Update(func(b *state.Batch) {
			if w != nil {
				err = b.InsertWorkload(w)
			} else {
				err = b.InsertService(s)
			}
		})
		if err != nil {
			t.Fatalf("store refused converted address: %v", err)
		}
		if s != nil {
			again, err := ServiceFromProto(ServiceToProto(s))
			if err != nil {
				t.Fatalf("round trip: %v", err)
			}
			if diff := cmp.Diff(s, again, cmpNetip); diff != "" {
				t.Fatalf("round trip (-first +second):\n%s", diff)
			}
		}
	})
}

// FuzzPolicyFromProto: no panic, and an accepted policy round-trips.
func FuzzPolicyFromProto(f *testing.F) {
	r := newGen(5)
	for range 20 {
		seedBytes(f, PolicyToProto(r.policy()))
	}
	seedBytes(f, &security.Authorization{Name: "p", Namespace: "ns", Action: 7})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a security.Authorization
		if proto.Unmarshal(b, &a) != nil {
			return
		}
		p, err := PolicyFromProto(&a)
		if err != nil {
			return
		}
		again, err := PolicyFromProto(PolicyToProto(p))
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if diff := cmp.Diff(p, again, cmpNetip); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
