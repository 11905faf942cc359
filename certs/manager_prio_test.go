package certs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

func ids(prefix string, n int) []identity.Identity {
	out := make([]identity.Identity, n)
	for i := range out {
		out[i] = identity.MustParse(fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s%d", prefix, prefix, i))
	}
	return out
}

// TestManagerPriorities fills the 8 Issue slots with Gets, queues three
// rotations and three prefetches behind them, then asks for a new identity
// and for one of the prefetched ones. As slots free up one by one, the new
// identity goes first, then the bumped prefetch, then the other prefetches
// in order, and the rotations last (SPEC §6.3).
func TestManagerPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, 2*time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		rot, busy, pre := ids("rot", 3), ids("busy", 8), ids("pre", 3)
		newID := identity.MustParse("spiffe://cluster.local/ns/new/sa/new")
		for _, id := range rot {
			mustGet(t, m, id)
		}
		stop := runManager(t, m)
		defer stop()

		gate := make(chan struct{})
		f.set(func(f *fakeIssuer) { f.gate = gate })
		var wg sync.WaitGroup
		for _, id := range busy {
			wg.Go(func() { mustGet(t, m, id) })
		}
		synctest.Wait()
		if n := len(f.callIDs()); n != len(rot)+8 {
			t.Fatalf("Issue calls with 8 Gets waiting = %d, want %d (8 in flight)", n, len(rot)+8)
		}

		// Rotations come due while every slot is taken: they queue.
		time.Sleep(time.Hour + time.Second)
		synctest.Wait()
		for _, id := range pre {
			m.Prefetch(id) // one at a time, so they queue in this order
			synctest.Wait()
		}
		wg.Go(func() { mustGet(t, m, newID) })
		synctest.Wait()
		wg.Go(func() { mustGet(t, m, pre[2]) }) // bumps the queued prefetch
		synctest.Wait()
		if n := len(f.callIDs()); n != len(rot)+8 {
			t.Fatalf("Issue calls while slots are full = %d, want %d (the rest queued)", n, len(rot)+8)
		}

		// Free one slot at a time and see who gets it.
		var order []identity.Identity
		for range 7 {
			gate <- struct{}{}
			synctest.Wait()
			calls := f.callIDs()
			order = append(order, calls[len(calls)-1])
		}
		want := []identity.Identity{newID, pre[2], pre[0], pre[1]}
		if diff := cmp.Diff(want, order[:4]); diff != "" {
			t.Errorf("slot order of real-time and warmup fetches (-want +got):\n%s", diff)
		}
		gotRot := slices.Clone(order[4:])
		slices.SortFunc(gotRot, func(a, b identity.Identity) int { return cmpID(a, b) })
		if diff := cmp.Diff(rot, gotRot); diff != "" {
			t.Errorf("rotations, last (-want +got):\n%s", diff)
		}
		close(gate)
		wg.Wait()
		synctest.Wait()
		for _, s := range m.States() {
			if s.Status != certs.StatusAvailable {
				t.Errorf("%v: status %q, want Available", s.Identity, s.Status)
			}
		}
	})
}

func cmpID(a, b identity.Identity) int {
	switch as, bs := a.String(), b.String(); {
	case as < bs:
		return -1
	case as > bs:
		return 1
	}
	return 0
}

func TestManagerPrefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})

		// Without Run, Prefetch only registers the identity.
		m.Prefetch(idA)
		m.Prefetch(identity.Identity{}) // ignored
		synctest.Wait()
		if s := m.States(); len(s) != 1 || s[0].Status != certs.StatusInitializing {
			t.Fatalf("States() after Prefetch without Run = %+v, want one Initializing", s)
		}
		if c := f.calls(); c != 0 {
			t.Fatalf("Issue calls without Run = %d, want 0", c)
		}

		stop := runManager(t, m)
		defer stop()
		synctest.Wait()
		if c := f.calls(); c != 1 {
			t.Fatalf("Issue calls after Run started = %d, want 1", c)
		}
		m.Prefetch(idB)
		synctest.Wait()
		if c := f.calls(); c != 2 {
			t.Fatalf("Issue calls after Prefetch(idB) = %d, want 2", c)
		}
		// A Get is now served from the cache, and Prefetch of a cached
		// identity does nothing.
		mustGet(t, m, idA)
		mustGet(t, m, idB)
		m.Prefetch(idA)
		synctest.Wait()
		if c := f.calls(); c != 2 {
			t.Errorf("Issue calls after Gets and re-Prefetch = %d, want 2", c)
		}

		// A failing prefetch backs off and Get reports its error at once.
		idC := identity.MustParse("spiffe://cluster.local/ns/c/sa/c")
		f.set(func(f *fakeIssuer) { f.fail = errCADown })
		m.Prefetch(idC)
		synctest.Wait()
		if _, err := m.Get(context.Background(), idC); !errors.Is(err, errCADown) {
			t.Errorf("Get after failed prefetch = %v, want %v", err, errCADown)
		}
		if c := f.calls(); c != 3 {
			t.Errorf("Issue calls = %d, want 3 (Get during backoff does not issue)", c)
		}
		m.Prefetch(idC) // backing off: no new attempt
		synctest.Wait()
		if c := f.calls(); c != 3 {
			t.Errorf("Issue calls after Prefetch during backoff = %d, want 3", c)
		}
	})
}

// TestManagerForgetCancelsPrefetch: a prefetch waiting for a slot (or in
// flight) is cancelled by Forget, and never issues afterwards.
func TestManagerForgetCancelsPrefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()
		block := make(chan struct{})
		f.set(func(f *fakeIssuer) { f.block = block })

		var wg sync.WaitGroup
		for _, id := range ids("busy", 8) {
			wg.Go(func() { mustGet(t, m, id) })
		}
		synctest.Wait()
		m.Prefetch(idA) // queued behind the 8 Gets
		m.Prefetch(idB)
		synctest.Wait()
		m.Forget(idA)
		synctest.Wait()
		close(block)
		wg.Wait()
		synctest.Wait()
		got := f.callIDs()
		if slices.Contains(got, idA) {
			t.Errorf("forgotten queued prefetch still issued; calls %v", got)
		}
		if !slices.Contains(got, idB) {
			t.Errorf("prefetch of idB never issued; calls %v", got)
		}

		// Forget of a prefetch already in flight cancels its Issue.
		block = make(chan struct{})
		f.set(func(f *fakeIssuer) { f.block = block })
		idC := identity.MustParse("spiffe://cluster.local/ns/c/sa/c")
		m.Prefetch(idC)
		synctest.Wait()
		m.Forget(idC)
		synctest.Wait() // the Issue saw its ctx end and returned
		if s := m.States(); slices.ContainsFunc(s, func(s certs.State) bool { return s.Identity == idC }) {
			t.Errorf("States() after Forget lists %v", idC)
		}
		close(block)
	})
}

// TestManagerGetJoinsRunningPrefetch: a Get for an identity being
// prefetched waits for that fetch rather than starting another, and gets
// its certificate even if Run stops meanwhile.
func TestManagerGetJoinsRunningPrefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		block := make(chan struct{})
		f.set(func(f *fakeIssuer) { f.block = block })
		m.Prefetch(idA)
		synctest.Wait()
		var got *certs.Cert
		var wg sync.WaitGroup
		wg.Go(func() { got = mustGet(t, m, idA) })
		synctest.Wait()
		if c := f.calls(); c != 1 {
			t.Fatalf("Issue calls with Get joining a prefetch = %d, want 1", c)
		}
		stop() // cancels the prefetch; the Get retries on its own
		synctest.Wait()
		f.set(func(f *fakeIssuer) { f.block = nil })
		close(block)
		wg.Wait()
		if got == nil || got.Identity != idA {
			t.Fatalf("Get = %v, want a cert for %v", got, idA)
		}
		if c := f.calls(); c != 2 {
			t.Errorf("Issue calls = %d, want 2", c)
		}
	})
}
