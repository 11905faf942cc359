package node

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/state"
)

// prefetcher is the part of certs.Manager the hook drives.
type prefetcher interface {
	Prefetch(id identity.Identity)
	Forget(id identity.Identity)
}

// certHook prefetches the certificate of every local workload's identity
// when the first such workload appears and forgets it when the last one goes
// (SPEC §5.4 "cert side effects", §6.3). It is the one cross-link between
// state and certs, wired here so that xds never imports certs.
type certHook struct {
	certs prefetcher
	local func(state.WorkloadNames) bool // reports whether the workload is served by this node

	mu    sync.Mutex
	count map[identity.Identity]int // local workloads per identity
}

func newCertHook(c prefetcher, local func(state.WorkloadNames) bool) *certHook {
	return &certHook{certs: c, local: local, count: make(map[identity.Identity]int)}
}

// update is a state.Config.OnUpdate: it looks only at the workloads the
// update changed, or at everything after a reset. It reads only their
// names (WorkloadNamesByUID builds no workload), since a push changes up
// to every workload of the mesh.
func (h *certHook) update(prev, next *state.Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := next.Changes()
	if ch.Reset || prev == nil {
		want := make(map[identity.Identity]int)
		for _, w := range next.Workloads() {
			if n := w.Names(); h.local(n) {
				want[n.Identity]++
			}
		}
		for id := range h.count {
			if want[id] == 0 {
				h.certs.Forget(id)
			}
		}
		for id := range want {
			if h.count[id] == 0 {
				h.certs.Prefetch(id)
			}
		}
		h.count = want
		return
	}
	for _, uid := range ch.Workloads {
		if old, ok := prev.WorkloadNamesByUID(uid); ok && h.local(old) {
			h.release(old.Identity)
		}
		if w, ok := next.WorkloadNamesByUID(uid); ok && h.local(w) {
			id := w.Identity
			if h.count[id]++; h.count[id] == 1 {
				h.certs.Prefetch(id)
			}
		}
	}
}

func (h *certHook) release(id identity.Identity) {
	if h.count[id]--; h.count[id] <= 0 {
		delete(h.count, id)
		h.certs.Forget(id)
	}
}

// errForeignIdentity is returned when a proxy asks for a certificate that is
// not its own workload's (TESTPLAN S11, bad input 51).
var errForeignIdentity = errors.New("refusing a certificate for an identity this proxy does not serve")

// ownCerts hands a proxy only its own workload's certificate: a coding error
// elsewhere cannot make it present, or ask the CA for, another identity.
type ownCerts struct {
	certs *certs.Manager
	store *state.Store
	local func(*state.Snapshot) *state.Workload
}

// Get returns the certificate for id if id is the local workload's identity.
func (o ownCerts) Get(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	w := o.local(o.store.Snapshot())
	if w == nil || w.Identity() != id {
		return nil, fmt.Errorf("%w: %s", errForeignIdentity, id)
	}
	return o.certs.Get(ctx, id)
}
