package connmgr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ns        = "default"
	serverUID = "c1//Pod/default/server"
	otherUID  = "c1//Pod/default/other"
	// closeWithin is SPEC §4.4's bound for closing a connection a policy
	// change denies.
	closeWithin = time.Second
)

var serverAddr = netip.MustParseAddrPort("10.0.0.2:8080")

func workload(uid, name, addr string) *state.Workload {
	return &state.Workload{
		UID: uid, Name: name, Namespace: ns, Protocol: state.TunnelHBONE,
		Addresses: []netip.Addr{netip.MustParseAddr(addr)},
	}
}

func id(sa string) identity.Identity {
	return identity.Identity{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: sa}
}

// principalPolicy is a Namespace-scoped policy of ns with one rule matching
// the given service accounts' principals.
func principalPolicy(name string, action rbac.Action, sas ...string) *rbac.Policy {
	var m rbac.Match
	for _, sa := range sas {
		m.Principals = append(m.Principals, rbac.StringMatch{Kind: rbac.Exact, Value: id(sa).Principal()})
	}
	return &rbac.Policy{
		Name: name, Namespace: ns, Scope: rbac.Namespace, Action: action,
		Rules: []rbac.Rule{{Clauses: []rbac.Clause{{Matches: []rbac.Match{m}}}}},
	}
}

// harness is a Manager fed by a real state.Store, with Run on a goroutine.
type harness struct {
	t  testing.TB
	m  *connmgr.Manager
	st *state.Store
}

// newHarness returns a harness whose store holds the server and other
// workloads. Run is started only if run is set.
func newHarness(t testing.TB, run bool) *harness {
	t.Helper()
	h := &harness{t: t}
	h.m = connmgr.New(connmgr.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	h.st = state.NewStore(state.Config{OnUpdate: func(_, next *state.Snapshot) { h.m.Notify(next) }})
	h.update(func(b *state.Batch) error {
		return errors.Join(b.InsertWorkload(workload(serverUID, "server", "10.0.0.2")),
			b.InsertWorkload(workload(otherUID, "other", "10.0.0.3")))
	})
	if run {
		h.run()
	}
	return h
}

// run starts Run and stops it (waiting for it) at cleanup.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.m.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
}

func (h *harness) update(fn func(b *state.Batch) error) {
	h.t.Helper()
	var err error
	h.st.Update(func(b *state.Batch) { err = fn(b) })
	if err != nil {
		h.t.Fatalf("update: %v", err)
	}
}

func (h *harness) insertPolicy(p *rbac.Policy) {
	h.t.Helper()
	h.update(func(b *state.Batch) error { return b.InsertPolicy(p) })
}

// waitChecked waits until the manager has finished a pass over the store's
// current snapshot.
func (h *harness) waitChecked() {
	h.t.Helper()
	want := h.st.Snapshot()
	deadline := time.Now().Add(5 * time.Second)
	for h.m.LastChecked() != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("no re-check pass over generation %d", want.Generation())
		}
		time.Sleep(time.Millisecond)
	}
}

// info describes a connection from service account sa to the server.
func info(uid, sa string, n int) connmgr.Info {
	return connmgr.Info{
		WorkloadUID: uid,
		Conn: rbac.Conn{
			Src:      netip.AddrPortFrom(netip.MustParseAddr("10.0.1.1"), uint16(40000+n)),
			Dst:      serverAddr,
			Identity: id(sa),
		},
		Inbound: "HBONE",
	}
}

// tracked is one registered connection: a real TCP pair whose server side
// echoes, and whose server side the manager closes.
type tracked struct {
	client, server net.Conn
	closeErr       chan error // receives what close was called with
	unregister     func()
}

// tcpPair returns a connected loopback TCP pair, closed at cleanup.
func tcpPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// register opens an echoing TCP pair and registers its server side.
func (h *harness) register(in connmgr.Info) *tracked {
	h.t.Helper()
	c, s := tcpPair(h.t)
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(s, s) })
	h.t.Cleanup(func() { s.Close(); wg.Wait() })
	tr := &tracked{client: c, server: s, closeErr: make(chan error, 2)}
	tr.unregister = h.m.Register(in, func(err error) {
		tr.closeErr <- err
		s.Close()
	})
	h.t.Cleanup(tr.unregister)
	return tr
}

// echo sends a fresh payload and checks it comes back.
func (tr *tracked) echo(t testing.TB, round int) {
	t.Helper()
	msg := fmt.Appendf(nil, "round %d payload %x", round, time.Now().UnixNano())
	tr.client.SetDeadline(time.Now().Add(5 * time.Second))
	defer tr.client.SetDeadline(time.Time{})
	if _, err := tr.client.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(tr.client, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if string(got) != string(msg) {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
}

// waitClosed checks that the client side sees the connection end within
// closeWithin and that close got ErrPolicyChanged.
func (tr *tracked) waitClosed(t testing.TB) {
	t.Helper()
	start := time.Now()
	tr.client.SetReadDeadline(start.Add(closeWithin))
	_, err := tr.client.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open %v after the policy change", closeWithin)
	}
	if err == nil {
		t.Fatal("read succeeded on a connection that should be closed")
	}
	select {
	case got := <-tr.closeErr:
		if !errors.Is(got, connmgr.ErrPolicyChanged) {
			t.Errorf("close called with %v, want ErrPolicyChanged", got)
		}
	default:
		t.Error("peer saw EOF but close was not called")
	}
	t.Logf("closed after %v", time.Since(start))
}

func (tr *tracked) assertNotClosed(t testing.TB) {
	t.Helper()
	select {
	case err := <-tr.closeErr:
		t.Fatalf("close called with %v on an allowed connection", err)
	default:
	}
}

func srcs(infos []connmgr.Info) []string {
	out := []string{}
	for _, in := range infos {
		out = append(out, in.Conn.Identity.ServiceAccount+"@"+in.Conn.Src.String())
	}
	return out
}

func TestDenyClosesOnlyDeniedConnection(t *testing.T) {
	h := newHarness(t, true)
	conns := map[string]*tracked{}
	for i, sa := range []string{"a", "b", "c"} {
		conns[sa] = h.register(info(serverUID, sa, i))
		conns[sa].echo(t, 0)
	}

	h.insertPolicy(principalPolicy("deny-b", rbac.Deny, "b"))
	conns["b"].waitClosed(t)

	h.waitChecked()
	for round := 1; round <= 3; round++ {
		for _, sa := range []string{"a", "c"} {
			conns[sa].echo(t, round)
			conns[sa].assertNotClosed(t)
		}
	}
	want := []string{"a@10.0.1.1:40000", "c@10.0.1.1:40002"}
	if diff := cmp.Diff(want, srcs(h.m.Connections(serverUID))); diff != "" {
		t.Errorf("Connections after deny (-want +got):\n%s", diff)
	}
	if got := h.m.Len(); got != 2 {
		t.Errorf("Len = %d, want 2", got)
	}
}

func TestAllowingChangeClosesNothing(t *testing.T) {
	h := newHarness(t, true)
	var conns []*tracked
	for i, sa := range []string{"a", "b", "c"} {
		conns = append(conns, h.register(info(serverUID, sa, i)))
	}
	// An ALLOW that admits all three, a DENY for someone else, and an
	// unrelated workload change: none of them denies a tracked connection.
	h.insertPolicy(principalPolicy("allow-abc", rbac.Allow, "a", "b", "c"))
	h.insertPolicy(principalPolicy("deny-z", rbac.Deny, "z"))
	h.update(func(b *state.Batch) error {
		return b.InsertWorkload(workload("c1//Pod/default/new", "new", "10.0.0.9"))
	})
	h.waitChecked()
	for _, tr := range conns {
		tr.assertNotClosed(t)
		tr.echo(t, 1)
	}
	if got := len(h.m.Connections(serverUID)); got != 3 {
		t.Errorf("tracked %d connections, want 3", got)
	}
}

func TestAllowPolicyExcludingConnectionCloses(t *testing.T) {
	h := newHarness(t, true)
	a := h.register(info(serverUID, "a", 0))
	b := h.register(info(serverUID, "b", 1))
	// The first enforced ALLOW turns the default from allow to deny.
	h.insertPolicy(principalPolicy("allow-a", rbac.Allow, "a"))
	b.waitClosed(t)
	h.waitChecked()
	a.assertNotClosed(t)
	a.echo(t, 1)
}

func TestUnregisterStopsTracking(t *testing.T) {
	h := newHarness(t, true)
	var calls atomic.Int32
	unregister := h.m.Register(info(serverUID, "b", 0), func(error) { calls.Add(1) })
	keep := h.register(info(serverUID, "a", 1))
	if got := h.m.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2", got)
	}
	unregister()
	unregister() // idempotent
	if diff := cmp.Diff([]string{"a@10.0.1.1:40001"}, srcs(h.m.Connections(serverUID))); diff != "" {
		t.Errorf("Connections after unregister (-want +got):\n%s", diff)
	}
	h.insertPolicy(principalPolicy("deny-b", rbac.Deny, "b"))
	h.waitChecked()
	if n := calls.Load(); n != 0 {
		t.Errorf("close called %d times on an unregistered connection", n)
	}
	keep.assertNotClosed(t)
	if got := h.m.Len(); got != 1 {
		t.Errorf("Len = %d, want 1", got)
	}
}

func TestWorkloadRemovedClosesItsConnections(t *testing.T) {
	h := newHarness(t, true)
	gone := h.register(info(serverUID, "a", 0))
	stays := h.register(info(otherUID, "a", 1))
	h.update(func(b *state.Batch) error {
		if !b.RemoveWorkload(serverUID) {
			return errors.New("server workload not found")
		}
		return nil
	})
	gone.waitClosed(t)
	h.waitChecked()
	stays.assertNotClosed(t)
	stays.echo(t, 1)
	if got := h.m.Connections(serverUID); len(got) != 0 {
		t.Errorf("Connections(removed workload) = %v, want none", got)
	}
}

func TestUnknownReferencedPolicyCloses(t *testing.T) {
	h := newHarness(t, true)
	tr := h.register(info(serverUID, "a", 0))
	w := workload(serverUID, "server", "10.0.0.2")
	w.AuthorizationPolicies = []string{ns + "/not-yet-here"}
	h.update(func(b *state.Batch) error { return b.InsertWorkload(w) })
	tr.waitClosed(t) // fail closed (rbac DeniedUnknownPolicy)
}

// A connection the proxy authorized against an older snapshot, registered
// after the pass for a denying snapshot listed the connections, must still
// be closed.
func TestRegisterAfterDenyIsClosed(t *testing.T) {
	h := newHarness(t, true)
	h.insertPolicy(principalPolicy("deny-b", rbac.Deny, "b"))
	h.waitChecked()
	allowed := h.register(info(serverUID, "a", 0))
	late := h.register(info(serverUID, "b", 1))
	late.waitClosed(t)
	allowed.assertNotClosed(t)
	allowed.echo(t, 1)
}

// Checked names the snapshot the caller authorized against: a stale one
// does not spare the connection a check against the newest.
func TestRegisterWithStaleCheckedIsClosed(t *testing.T) {
	h := newHarness(t, true)
	stale := h.st.Snapshot()
	h.insertPolicy(principalPolicy("deny-b", rbac.Deny, "b"))
	h.waitChecked()
	in := info(serverUID, "b", 1)
	in.Checked = stale
	h.register(in).waitClosed(t)
}

func TestNotifyBurstCoalesced(t *testing.T) {
	h := newHarness(t, false) // Run not started: Notify must not block
	conns := map[string]*tracked{}
	for i, sa := range []string{"a", "b", "c"} {
		conns[sa] = h.register(info(serverUID, sa, i))
	}
	const burst = 1000
	for i := range burst {
		target := "nobody"
		if i%2 == 1 {
			target = "b" // the last update (i = 999) denies b
		}
		h.insertPolicy(principalPolicy("flip", rbac.Deny, target))
	}
	h.run()
	conns["b"].waitClosed(t)
	h.waitChecked()
	if got := h.m.Passes(); got != 1 {
		t.Errorf("%d notifications made %d passes, want 1", burst, got)
	}
	conns["a"].assertNotClosed(t)
	conns["c"].assertNotClosed(t)
}

func TestNotifyBurstWhileRunningEndsOnNewest(t *testing.T) {
	h := newHarness(t, true)
	conns := map[string]*tracked{}
	for i, sa := range []string{"a", "b", "c"} {
		conns[sa] = h.register(info(serverUID, sa, i))
	}
	const burst = 1000
	start := time.Now()
	for i := range burst {
		// Deny only "nobody" or "x" until the very last update.
		target := []string{"nobody", "x"}[i%2]
		if i == burst-1 {
			target = "c"
		}
		h.insertPolicy(principalPolicy("flip", rbac.Deny, target))
	}
	t.Logf("%d updates with Notify took %v", burst, time.Since(start))
	conns["c"].waitClosed(t)
	h.waitChecked()
	conns["a"].assertNotClosed(t)
	conns["b"].assertNotClosed(t)
	if got := h.m.Passes(); got > burst {
		t.Errorf("%d passes for %d notifications", got, burst)
	}
	t.Logf("%d notifications, %d passes", burst, h.m.Passes())
}

func TestRunTwice(t *testing.T) {
	h := newHarness(t, true)
	// Wait until the first Run is active: it has checked the initial state
	// if one was notified.
	h.waitChecked()
	if err := h.m.Run(context.Background()); !errors.Is(err, connmgr.ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
}

func TestManyConnectionsRecheckedQuickly(t *testing.T) {
	h := newHarness(t, true)
	const n = 10_000
	var closed atomic.Int32
	done := make(chan struct{})
	for i := range n {
		sa := fmt.Sprintf("sa-%d", i%100)
		uid := serverUID
		if i%2 == 1 {
			uid = otherUID
		}
		h.m.Register(info(uid, sa, i), func(error) {
			if closed.Add(1) == n/100 {
				close(done)
			}
		})
	}
	start := time.Now()
	h.insertPolicy(principalPolicy("deny-sa-7", rbac.Deny, "sa-7"))
	select {
	case <-done:
	case <-time.After(closeWithin):
		t.Fatalf("%d of %d denied connections closed within %v", closed.Load(), n/100, closeWithin)
	}
	elapsed := time.Since(start)
	h.waitChecked()
	if got := closed.Load(); got != n/100 {
		t.Errorf("closed %d connections, want %d", got, n/100)
	}
	if got := h.m.Len(); got != n-n/100 {
		t.Errorf("Len = %d, want %d", got, n-n/100)
	}
	t.Logf("%d connections re-checked, %d closed in %v", n, n/100, elapsed)
}

// Register, unregister and policy flips race; every close happens at most
// once and never for a connection still allowed at the end.
func TestConcurrentRegisterAndUpdates(t *testing.T) {
	h := newHarness(t, true)
	const workers, perWorker = 4, 200
	var wg sync.WaitGroup
	var doubleClose atomic.Int32
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				var calls atomic.Int32
				unregister := h.m.Register(info(serverUID, []string{"a", "b"}[i%2], w*perWorker+i), func(error) {
					if calls.Add(1) > 1 {
						doubleClose.Add(1)
					}
				})
				if i%3 == 0 {
					unregister()
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 100 {
			h.insertPolicy(principalPolicy("flip", rbac.Deny, []string{"a", "b"}[i%2]))
		}
	})
	wg.Wait()
	h.insertPolicy(principalPolicy("flip", rbac.Deny, "b")) // final: b denied
	h.waitChecked()
	if n := doubleClose.Load(); n != 0 {
		t.Errorf("%d connections closed more than once", n)
	}
	for _, in := range h.m.Connections(serverUID) {
		if in.Conn.Identity.ServiceAccount == "b" {
			t.Errorf("connection %v still tracked after DENY for b", in.Conn.Src)
		}
	}
}

func TestConnectionsSorted(t *testing.T) {
	m := connmgr.New(connmgr.Config{})
	for _, n := range []int{3, 1, 2} {
		m.Register(info(serverUID, "a", n), func(error) {})
	}
	m.Register(info(otherUID, "a", 0), func(error) {})
	got := srcs(m.Connections(serverUID))
	want := []string{"a@10.0.1.1:40001", "a@10.0.1.1:40002", "a@10.0.1.1:40003"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Connections (-want +got):\n%s", diff)
	}
	if !slices.Equal(srcs(m.Connections("nope")), []string{}) {
		t.Error("Connections of an unknown workload not empty")
	}
}

// BenchmarkRecheck10k measures one re-check pass over 10,000 allowed
// connections spread over 100 workloads, with 10 applicable policies.
func BenchmarkRecheck10k(b *testing.B) {
	m := connmgr.New(connmgr.Config{})
	st := state.NewStore(state.Config{})
	var err error
	st.Update(func(bt *state.Batch) {
		var errs []error
		for w := range 100 {
			errs = append(errs, bt.InsertWorkload(workload(fmt.Sprintf("c1//Pod/default/w%d", w),
				fmt.Sprintf("w%d", w), fmt.Sprintf("10.0.%d.%d", w/250, w%250+1))))
		}
		for p := range 9 {
			errs = append(errs, bt.InsertPolicy(principalPolicy(fmt.Sprintf("deny-%d", p), rbac.Deny, fmt.Sprintf("bad-%d", p))))
		}
		errs = append(errs, bt.InsertPolicy(principalPolicy("allow", rbac.Allow, "a")))
		err = errors.Join(errs...)
	})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10_000 {
		m.Register(info(fmt.Sprintf("c1//Pod/default/w%d", i%100), "a", i), func(error) { b.Error("closed") })
	}
	snap := st.Snapshot()
	r := connmgr.NewRecheckerForTest(m)
	r.Recheck(snap) // size the scratch buffer
	b.ReportAllocs()
	for b.Loop() {
		r.Recheck(snap)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10_000, "ns/conn")
}
