package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/state"
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
	hook := newCertHook(rec, func(w *state.Workload) bool { return w.Node == "n1" })
	st := state.NewStore(state.Config{OnUpdate: hook.update})
	wl := func(uid, node, sa string) *state.Workload {
		return &state.Workload{UID: uid, Name: uid, Namespace: "ns", Node: node, ServiceAccount: sa,
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0." + fmt.Sprint(len(uid)))}, Protocol: state.HBONE}
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

// TestOwnCertsOnly: a dedicated proxy may hold only its own workload's
// certificate; asking for another identity fails locally and the CA sees no
// request for it (TESTPLAN S11, bad input 51).
func TestOwnCertsOnly(t *testing.T) {
	nextNet++
	ip := fmt.Sprintf("127.88.%d.2", nextNet)
	cp := newControlPlane(t)
	n := cp.startNode(t, "client", ip)
	cp.xds.PushWorkload(workload("client", ip))
	own := ownCerts{certs: n.certs, store: n.store, local: n.findLocal}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for n.findLocal(n.store.Snapshot()) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	self := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	if _, err := own.Get(ctx, self); err != nil {
		t.Fatalf("own identity: %v", err)
	}
	other := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "server"}
	if _, err := own.Get(ctx, other); !errors.Is(err, errForeignIdentity) {
		t.Errorf("foreign identity: err = %v, want %v", err, errForeignIdentity)
	}
	for _, r := range cp.cas.Requests() {
		if r.Identity == other {
			t.Errorf("the CA was asked for %s", other)
		}
	}
}

// TestXDSDownAfterWarmUp (TESTPLAN F2): once workloads are known, the data
// plane keeps working while istiod is unreachable.
func TestXDSDownAfterWarmUp(t *testing.T) {
	nextNet++
	clientIP, serverIP := fmt.Sprintf("127.88.%d.2", nextNet), fmt.Sprintf("127.88.%d.3", nextNet)
	cp := newControlPlane(t)
	cp.startNode(t, "client", clientIP)
	cp.startNode(t, "server", serverIP)
	echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Fatalf("warm-up connection: %v", err)
	}
	cp.xds.Blackhole(true)
	cp.xds.CloseStreams(status.Error(codes.Unavailable, "istiod going away"))
	for i := range 5 {
		if err := socksPing(clientIP, serverIP+":8080"); err != nil {
			t.Fatalf("connection %d with xDS down: %v", i, err)
		}
	}
}
