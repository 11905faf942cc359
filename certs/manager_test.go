package certs_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
)

// fakeIssuer issues certificates valid for exactly [now, now+ttl] from a
// localca root, records when it was called, and can fail or block.
type fakeIssuer struct {
	ca  *localca.CA
	ttl time.Duration

	mu      sync.Mutex
	times   []time.Time
	ids     []identity.Identity // requested identities, in call order
	fail    error               // if non-nil, Issue returns it
	block   chan struct{}       // if non-nil, Issue waits for it to close (or ctx)
	gate    chan struct{}       // if non-nil, Issue waits for one value from it (or ctx)
	issueAs *identity.Identity  // if non-nil, issue for this identity instead
	roots   []*x509.Certificate // if non-nil, the root bundle answered instead of ca's roots
}

var errCADown = errors.New("CA unavailable")

// newFakeIssuer must be called inside the synctest bubble, if any, so that
// the root is valid at the bubble's clock.
func newFakeIssuer(t testing.TB, ttl time.Duration) *fakeIssuer {
	t.Helper()
	return &fakeIssuer{ca: newCA(t), ttl: ttl}
}

func (f *fakeIssuer) Issue(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	f.mu.Lock()
	f.times = append(f.times, time.Now())
	f.ids = append(f.ids, id)
	fail, block, gate, as, ca, roots := f.fail, f.block, f.gate, f.issueAs, f.ca, f.roots
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	if as != nil {
		id = *as
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(id.String())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	leaf, err := ca.IssueWithTemplate(ctx, key, &x509.Certificate{
		URIs:        []*url.URL{u},
		NotBefore:   now,
		NotAfter:    now.Add(f.ttl),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	if roots == nil {
		roots = ca.Roots()
	}
	return certs.NewCert(id, append([]*x509.Certificate{leaf}, ca.Intermediates()...), key, roots)
}

func (f *fakeIssuer) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.times)
}

func (f *fakeIssuer) callIDs() []identity.Identity {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]identity.Identity(nil), f.ids...)
}

func (f *fakeIssuer) callTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.times...)
}

func (f *fakeIssuer) set(fn func(f *fakeIssuer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// runManager starts m.Run and returns a stop func that cancels it and
// checks that it returned.
func runManager(t *testing.T, m *certs.Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	}
}

func mustGet(t *testing.T, m *certs.Manager, id identity.Identity) *certs.Cert {
	t.Helper()
	c, err := m.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%v): %v", id, err)
	}
	return c
}

func TestManagerSingleFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		f.block = make(chan struct{})
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		const n = 20
		got := make([]*certs.Cert, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { got[i] = mustGet(t, m, idA) })
		}
		synctest.Wait()
		if c := f.calls(); c != 1 {
			t.Fatalf("%d concurrent Gets made %d Issue calls, want 1", n, c)
		}
		if s := m.States(); len(s) != 1 || s[0].Status != certs.StatusInitializing || s[0].Cert != nil {
			t.Errorf("States() while issuing = %+v, want one Initializing", s)
		}
		close(f.block)
		wg.Wait()
		for i, c := range got {
			if c == nil || c != got[0] {
				t.Fatalf("Get #%d returned %p, want the shared %p", i, c, got[0])
			}
		}
		if c := f.calls(); c != 1 {
			t.Errorf("Issue calls = %d, want 1", c)
		}
	})
}

func TestManagerCachedReuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		c1 := mustGet(t, m, idA)
		time.Sleep(50 * time.Minute)
		if c2 := mustGet(t, m, idA); c2 != c1 {
			t.Errorf("second Get returned a new cert")
		}
		if c := f.calls(); c != 1 {
			t.Errorf("Issue calls = %d, want 1", c)
		}
		if c := mustGet(t, m, idB); c.Identity != idB {
			t.Errorf("Get(idB).Identity = %v", c.Identity)
		}
		// Without Run, an expired cert is replaced on demand.
		time.Sleep(11 * time.Minute)
		if c3 := mustGet(t, m, idA); c3 == c1 {
			t.Errorf("Get after expiry returned the expired cert")
		}
		if c := f.calls(); c != 3 {
			t.Errorf("Issue calls = %d, want 3", c)
		}
	})
}

func TestManagerRefreshAtHalfLife(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, 2*time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()

		c1 := mustGet(t, m, idA)
		halfLife := func(c *certs.Cert) time.Time {
			leaf := c.Chain()[0]
			return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
		}
		time.Sleep(time.Until(halfLife(c1)) - time.Second)
		synctest.Wait()
		if c := f.calls(); c != 1 {
			t.Fatalf("Issue calls 1s before half-life = %d, want 1", c)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if c := f.calls(); c != 2 {
			t.Fatalf("Issue calls 1s after half-life = %d, want 2", c)
		}
		c2 := mustGet(t, m, idA)
		if c2 == c1 || !c2.NotBefore().After(c1.NotBefore()) {
			t.Fatalf("Get after refresh returned the old cert")
		}
		// And again at the new cert's half-life.
		time.Sleep(time.Until(halfLife(c2)) + time.Second)
		synctest.Wait()
		if c := f.calls(); c != 3 {
			t.Errorf("Issue calls after second half-life = %d, want 3", c)
		}
	})
}

func TestManagerFailureKeepsOldCert(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, 100*time.Second)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()

		c1 := mustGet(t, m, idA)
		f.set(func(f *fakeIssuer) { f.fail = errCADown })
		time.Sleep(time.Until(c1.RefreshTime()) + 20*time.Second)
		synctest.Wait()
		if c := f.calls(); c < 3 {
			t.Fatalf("Issue calls after failing refreshes = %d, want ≥ 3", c)
		}
		if c := mustGet(t, m, idA); c != c1 {
			t.Errorf("Get during failing refresh did not return the old valid cert")
		}
		if s := m.States(); s[0].Status != certs.StatusAvailable || s[0].Cert != c1 {
			t.Errorf("States() with valid old cert = %q, want Available", s[0].Status)
		}

		// Past expiry with the CA still down: Unavailable and Get fails.
		time.Sleep(time.Until(c1.NotAfter()) + time.Millisecond)
		synctest.Wait()
		times := f.callTimes()
		retriedAtExpiry := false
		for _, tm := range times {
			retriedAtExpiry = retriedAtExpiry || tm.Equal(c1.NotAfter())
		}
		if !retriedAtExpiry {
			t.Errorf("no retry at expiry %v; attempts %v", c1.NotAfter(), times)
		}
		s := m.States()
		if want := "Unavailable: "; !strings.HasPrefix(s[0].Status, want) || !strings.Contains(s[0].Status, errCADown.Error()) {
			t.Errorf("States() after expiry = %q, want %q…%v", s[0].Status, want, errCADown)
		}
		before := f.calls()
		if _, err := m.Get(context.Background(), idA); !errors.Is(err, errCADown) {
			t.Errorf("Get after expiry = %v, want %v", err, errCADown)
		}
		if f.calls() != before {
			t.Errorf("Get while backing off called the issuer")
		}

		// The CA recovers: available again within one maximum backoff.
		f.set(func(f *fakeIssuer) { f.fail = nil })
		time.Sleep(151 * time.Second)
		synctest.Wait()
		if s := m.States(); s[0].Status != certs.StatusAvailable {
			t.Errorf("States() after recovery = %q, want Available", s[0].Status)
		}
		if c := mustGet(t, m, idA); c == c1 {
			t.Errorf("Get after recovery returned the expired cert")
		}
	})
}

func TestManagerBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		f.fail = errCADown
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()
		synctest.Wait() // Run is waiting

		if _, err := m.Get(context.Background(), idA); !errors.Is(err, errCADown) {
			t.Fatalf("Get = %v, want %v", err, errCADown)
		}
		time.Sleep(20 * time.Minute)
		synctest.Wait()
		times := f.callTimes()
		if len(times) < 10 {
			t.Fatalf("only %d attempts in 20 minutes", len(times))
		}
		want := time.Second
		for i := 1; i < len(times); i++ {
			d := times[i].Sub(times[i-1])
			lo, hi := time.Duration(float64(want)*0.8), min(time.Duration(float64(want)*1.2), 150*time.Second)
			if d < lo || d > hi {
				t.Errorf("retry %d after %v, want within [%v, %v]", i, d, lo, hi)
			}
			want = min(2*want, 150*time.Second)
		}
	})
}

func TestManagerStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		if s := m.States(); len(s) != 0 {
			t.Errorf("States() of new manager = %v", s)
		}
		ids := []identity.Identity{
			identity.MustParse("spiffe://td/ns/z/sa/z"),
			identity.MustParse("spiffe://td/ns/a/sa/b"),
			identity.MustParse("spiffe://td/ns/a/sa/a"),
			identity.MustParse("spiffe://a.td/ns/z/sa/z"),
		}
		for _, id := range ids[:3] {
			mustGet(t, m, id)
		}
		f.set(func(f *fakeIssuer) { f.fail = errCADown })
		if _, err := m.Get(context.Background(), ids[3]); err == nil {
			t.Fatal("Get with failing issuer succeeded")
		}
		type row struct{ ID, Status string }
		var got []row
		for _, s := range m.States() {
			got = append(got, row{s.Identity.String(), s.Status})
			if (s.Cert != nil) != (s.Status == certs.StatusAvailable) {
				t.Errorf("%v: Cert %v with status %q", s.Identity, s.Cert, s.Status)
			}
		}
		want := []row{
			{"spiffe://a.td/ns/z/sa/z", "Unavailable: certs: issue spiffe://a.td/ns/z/sa/z: " + errCADown.Error()},
			{"spiffe://td/ns/a/sa/a", certs.StatusAvailable},
			{"spiffe://td/ns/a/sa/b", certs.StatusAvailable},
			{"spiffe://td/ns/z/sa/z", certs.StatusAvailable},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("States() (-want +got):\n%s", diff)
		}
	})
}

func TestManagerForget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		mustGet(t, m, idA)
		m.Forget(idA)
		if s := m.States(); len(s) != 0 {
			t.Errorf("States() after Forget = %v", s)
		}
		mustGet(t, m, idA)
		if c := f.calls(); c != 2 {
			t.Errorf("Issue calls = %d, want 2 (forgotten cert not reused)", c)
		}

		// Forget during an in-flight Issue: the waiter gets its cert, but it
		// is not cached.
		m.Forget(idA)
		f.set(func(f *fakeIssuer) { f.block = make(chan struct{}) })
		var got *certs.Cert
		var wg sync.WaitGroup
		wg.Go(func() { got = mustGet(t, m, idA) })
		synctest.Wait()
		m.Forget(idA)
		close(f.block)
		wg.Wait()
		if got == nil {
			t.Fatal("in-flight Get got no cert")
		}
		if s := m.States(); len(s) != 0 {
			t.Errorf("States() after Forget during Issue = %v", s)
		}
	})
}

func TestManagerWrongIdentity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		f.issueAs = &idB
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		if c, err := m.Get(context.Background(), idA); !errors.Is(err, certs.ErrIdentityMismatch) {
			t.Errorf("Get = %v, %v; want ErrIdentityMismatch", c, err)
		}
		if _, err := m.Get(context.Background(), identity.Identity{}); err == nil {
			t.Errorf("Get(zero identity) succeeded")
		}
	})
}

func TestManagerLeaderCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		f.block = make(chan struct{})
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		leaderCtx, cancel := context.WithCancel(context.Background())
		var leaderErr error
		var follower *certs.Cert
		var wg sync.WaitGroup
		wg.Go(func() { _, leaderErr = m.Get(leaderCtx, idA) })
		synctest.Wait()
		wg.Go(func() { follower = mustGet(t, m, idA) })
		synctest.Wait()
		cancel()
		synctest.Wait()
		if c := f.calls(); c != 2 {
			t.Errorf("Issue calls after leader cancel = %d, want 2 (follower retries)", c)
		}
		close(f.block)
		wg.Wait()
		if !errors.Is(leaderErr, context.Canceled) {
			t.Errorf("leader Get = %v, want context.Canceled", leaderErr)
		}
		if follower == nil {
			t.Errorf("follower got no cert")
		}
		if s := m.States(); s[0].Status != certs.StatusAvailable {
			t.Errorf("status = %q, want Available (a cancelled caller is not a CA failure)", s[0].Status)
		}
	})
}

func TestManagerRunStopsDuringRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeIssuer(t, time.Hour)
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		c1 := mustGet(t, m, idA)
		f.set(func(f *fakeIssuer) { f.block = make(chan struct{}) })
		stop := runManager(t, m)
		time.Sleep(time.Until(c1.RefreshTime()) + time.Second)
		synctest.Wait()
		if c := f.calls(); c != 2 {
			t.Fatalf("Issue calls = %d, want 2 (refresh in flight)", c)
		}
		stop() // returns only after the blocked refresh gave up
		if s := m.States(); s[0].Status != certs.StatusAvailable {
			t.Errorf("status after stop = %q, want Available", s[0].Status)
		}
		// A later Run resumes the refresh.
		f.set(func(f *fakeIssuer) { f.block = nil })
		stop = runManager(t, m)
		synctest.Wait()
		if c := f.calls(); c != 3 {
			t.Errorf("Issue calls after restart = %d, want 3", c)
		}
		stop()
	})
}

func TestManagerRun(t *testing.T) {
	ca := newCA(t)
	m := certs.NewManager(certs.ManagerConfig{Issuer: ca})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- m.Run(ctx) }()
	}
	mustGet(t, m, idA)
	// Of two concurrent Runs, one is refused at once.
	select {
	case err := <-done:
		if !errors.Is(err, certs.ErrManagerRunning) {
			t.Errorf("second Run = %v, want ErrManagerRunning", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("neither Run returned")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewManagerPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewManager(nil Issuer) did not panic")
		}
	}()
	certs.NewManager(certs.ManagerConfig{})
}
