package node

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/state"
)

type recordingPrefetcher struct{ calls []string }

func (r *recordingPrefetcher) Prefetch(id identity.Identity) {
	r.calls = append(r.calls, "prefetch "+id.ServiceAccount)
}
func (r *recordingPrefetcher) Forget(id identity.Identity) {
	r.calls = append(r.calls, "forget "+id.ServiceAccount)
}

// TestCertHook: the first local workload of an identity prefetches its
// certificate, the last one leaving forgets it, non-local ones do nothing.
func TestCertHook(t *testing.T) {
	rec := &recordingPrefetcher{}
	hook := newCertHook(rec, func(w state.WorkloadNames) bool { return w.Node == "n1" })
	st := state.NewStore(state.Config{OnUpdate: hook.update})
	wl := func(uid, node, sa string) *state.Workload {
		return &state.Workload{UID: uid, Name: uid, Namespace: "ns", Node: node, ServiceAccount: sa,
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0." + fmt.Sprint(len(uid)))}, Protocol: state.TunnelHBONE}
	}
	step := func(f func(b *state.Batch), want ...string) {
		t.Helper()
		rec.calls = nil
		st.Update(f)
		if !slices.Equal(rec.calls, want) {
			t.Errorf("calls = %q, want %q", rec.calls, want)
		}
	}
	step(func(b *state.Batch) { b.InsertWorkload(wl("a", "n1", "sa1")) }, "prefetch sa1")
	step(func(b *state.Batch) { b.InsertWorkload(wl("bb", "n1", "sa1")) })
	step(func(b *state.Batch) { b.InsertWorkload(wl("ccc", "n2", "sa2")) })
	step(func(b *state.Batch) { b.RemoveWorkload("a") })
	step(func(b *state.Batch) { b.RemoveWorkload("bb") }, "forget sa1")
	step(func(b *state.Batch) { b.InsertWorkload(wl("ccc", "n1", "sa2")) }, "prefetch sa2")
	step(func(b *state.Batch) { b.Reset() }, "forget sa2")
}
