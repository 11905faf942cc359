package inpod_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"istio.io/istio/pkg/zdsapi"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/proxy/netns"
)

func TestNewRequiresStart(t *testing.T) {
	if _, err := inpod.New(inpod.Config{}); err == nil {
		t.Fatal("New without Start succeeded")
	}
}

// TestHelloThenSilence: the Manager's first datagram is ZdsHello{V1}
// (inpodtest checks it in Accept), and then it sends nothing unsolicited,
// which istio-cni's liveness probe treats as a protocol error.
func TestHelloThenSilence(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	if err := c.CheckAlive(50 * time.Millisecond); err != nil {
		t.Fatalf("CheckAlive after hello: %v", err)
	}
	if h.m.Ready() {
		t.Fatal("Ready() before the snapshot")
	}
	h.wantPods()
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	if err := c.WaitClosed(); err != nil {
		t.Fatalf("connection after Run returned: %v", err)
	}
}

func TestRunTwice(t *testing.T) {
	h := newHarness(t, nil)
	h.accept()
	if err := h.m.Run(t.Context()); err == nil {
		t.Fatal("second Run returned nil")
	}
}

// TestAddStartsPod: an Add starts the pod with its info and a Netns for
// the very fd sent; readiness waits for SnapshotSent.
func TestAddStartsPod(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	f := newNSFile(t)
	info := infoFor("a")
	ack, err := c.Add("a", info, f.fd())
	mustAck(t, "Add", ack, err)
	h.wantEvents("start a")
	p := h.fake.pod("a")
	if p.info != info {
		t.Errorf("Start info = %+v, want %+v", p.info, info)
	}
	want, err := netns.Open(f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if !p.ns.Same(want) {
		t.Errorf("Start netns (inode %d) is not the sent one (inode %d)", p.ns.Inode(), want.Inode())
	}
	h.wantPods(up("a", info))
	if h.m.Ready() {
		t.Fatal("Ready() before SnapshotSent")
	}
	mustSnapshot(t, c)
	if !h.m.Ready() {
		t.Fatal("not Ready() once SnapshotSent is acked")
	}
	h.wantReady(true)
}

// TestAfterAckOnlyPastTheSnapshot: AfterAck runs after SnapshotSent's Ack
// and after each later request's, never for the Adds of the snapshot,
// which it would otherwise compete with (a node's certificate fetches).
func TestAfterAckOnlyPastTheSnapshot(t *testing.T) {
	type call struct{ ready bool }
	calls := make(chan call, 16)
	var h *harness
	h = newHarness(t, func(c *inpod.Config) {
		c.AfterAck = func() { calls <- call{ready: h.m.Ready()} }
	})
	c := h.accept()
	for _, uid := range []string{"a", "b"} {
		ack, err := c.Add(uid, infoFor(uid), newNSFile(t).fd())
		mustAck(t, "Add "+uid, ack, err)
	}
	mustSnapshot(t, c)
	ack, err := c.Add("c", infoFor("c"), newNSFile(t).fd())
	mustAck(t, "Add c", ack, err)
	for i, what := range []string{"SnapshotSent", "the Add after it"} {
		select {
		case got := <-calls:
			if !got.ready {
				t.Errorf("AfterAck call %d ran before the snapshot was acked; want the first after %s", i, what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no AfterAck after %s", what)
		}
	}
	select {
	case <-calls:
		t.Error("AfterAck ran more often than once per Ack past the snapshot")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestAddSameNetnsIsIdempotent: a second Add with the same netns (another
// fd on it) acks without a second Start and closes the new fd.
func TestAddSameNetnsIsIdempotent(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	f := newNSFile(t)
	ack, err := c.Add("a", infoFor("a"), f.fd())
	mustAck(t, "Add", ack, err)
	wantOpenFDs(t, f, 2) // ours and the Manager's
	f2 := f.reopen(t)
	ack, err = c.Add("a", infoFor("a"), f2.fd())
	mustAck(t, "second Add", ack, err)
	h.wantEvents("start a")
	wantOpenFDs(t, f, 3) // ours two and the Manager's first
}

// TestAddNewNetnsReplacesPod: an Add with another netns stops the old pod
// before starting the new one, and closes the old netns.
func TestAddNewNetnsReplacesPod(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	f1, f2 := newNSFile(t), newNSFile(t)
	ack, err := c.Add("a", infoFor("a"), f1.fd())
	mustAck(t, "Add", ack, err)
	ack, err = c.Add("a", infoFor("a"), f2.fd())
	mustAck(t, "Add with a new netns", ack, err)
	h.wantEvents("start a", "stop a", "start a")
	wantOpenFDs(t, f1, 1)
	wantOpenFDs(t, f2, 2)
	want, err := netns.Open(f2.path)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if !h.fake.pod("a").ns.Same(want) {
		t.Error("the new pod did not get the new netns")
	}
}

// TestDelAfterSnapshotStopsAtOnce: after the snapshot a Del stops the pod
// before it is acked; a Del for an unknown uid is acked too.
func TestDelAfterSnapshotStopsAtOnce(t *testing.T) {
	h, c, f := upWithPod(t, "a")
	ack, err := c.Del("a")
	mustAck(t, "Del", ack, err)
	h.wantEvents("start a", "stop a")
	h.wantPods()
	wantOpenFDs(t, f, 1)
	ack, err = c.Del("never-added")
	mustAck(t, "Del of an unknown uid", ack, err)
	h.noReadyChange()
}

// TestFDsOnOtherRequestsAreClosed: descriptors attached to Keep, Del and
// SnapshotSent are closed, and the requests still succeed.
func TestFDsOnOtherRequestsAreClosed(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	f := newNSFile(t)
	keep := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: "k"}}}
	ack, err := c.Request(keep, f.fd())
	mustAck(t, "Keep with an fd", ack, err)
	snap := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}
	ack, err = c.Request(snap, f.fd())
	mustAck(t, "SnapshotSent with an fd", ack, err)
	del := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: "k"}}}
	ack, err = c.Request(del, f.fd(), f.fd())
	mustAck(t, "Del with two fds", ack, err)
	wantOpenFDs(t, f, 1)
	h.wantEvents()
}

// TestSnapshotReconciles: a reconnect's snapshot keeps the pods it names by
// Add (same netns: untouched) or Keep, and stops the rest — including one
// named and then deleted before SnapshotSent. Pods survive the disconnect.
func TestSnapshotReconciles(t *testing.T) {
	h := newHarness(t, nil)
	c := h.accept()
	files := map[string]nsFile{}
	for _, uid := range []string{"a", "b", "c", "d", "e"} {
		files[uid] = newNSFile(t)
	}
	for _, uid := range []string{"a", "b", "c", "d"} {
		ack, err := c.Add(uid, infoFor(uid), files[uid].fd())
		mustAck(t, "Add "+uid, ack, err)
	}
	ack, err := c.SnapshotSent()
	mustAck(t, "SnapshotSent", ack, err)
	h.wantReady(true)
	h.wantEvents("start a", "start b", "start c", "start d")

	c.Close()
	h.wantReady(false)
	c = h.accept()
	h.wantEvents() // nothing stopped by the disconnect
	h.wantPods(up("a", infoFor("a")), up("b", infoFor("b")), up("c", infoFor("c")), up("d", infoFor("d")))

	ack, err = c.Add("a", infoFor("a"), files["a"].fd())
	mustAck(t, "Add a (same netns)", ack, err)
	ack, err = c.Keep("b")
	mustAck(t, "Keep b", ack, err)
	ack, err = c.Keep("unknown")
	mustAck(t, "Keep unknown", ack, err)
	ack, err = c.Add("e", infoFor("e"), files["e"].fd())
	mustAck(t, "Add e", ack, err)
	ack, err = c.Del("a")
	mustAck(t, "Del a before SnapshotSent", ack, err)
	h.wantEvents("start e")
	if h.m.Ready() {
		t.Fatal("Ready() before the new snapshot is processed")
	}
	mustSnapshot(t, c)
	h.wantEventSet("stop a", "stop c", "stop d")
	h.wantPods(up("b", infoFor("b")), up("e", infoFor("e")))
	h.wantReady(true)
	for uid, want := range map[string]int{"a": 1, "b": 2, "c": 1, "d": 1, "e": 2} {
		wantOpenFDs(t, files[uid], want)
	}
}

// TestProtocolErrors: each protocol error of SPEC §9 is NACKed, then Run
// stops every pod and returns an error wrapping ErrProtocol.
func TestProtocolErrors(t *testing.T) {
	tests := []struct {
		name string
		do   func(t *testing.T, c *inpodtest.Conn, f nsFile) (string, error)
	}{
		{"keep after snapshot", func(t *testing.T, c *inpodtest.Conn, f nsFile) (string, error) {
			ack, err := c.SnapshotSent()
			mustAck(t, "SnapshotSent", ack, err)
			return c.Keep("a")
		}},
		{"second snapshot", func(t *testing.T, c *inpodtest.Conn, f nsFile) (string, error) {
			ack, err := c.SnapshotSent()
			mustAck(t, "SnapshotSent", ack, err)
			return c.SnapshotSent()
		}},
		{"add without workload_info", func(t *testing.T, c *inpodtest.Conn, f nsFile) (string, error) {
			req := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "x"}}}
			return c.Request(req, f.fd())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			c := h.accept()
			fa, fx := newNSFile(t), newNSFile(t)
			ack, err := c.Add("a", infoFor("a"), fa.fd())
			mustAck(t, "Add", ack, err)
			ack, err = tt.do(t, c, fx)
			nack := mustNack(t, tt.name, ack, err)
			if !strings.Contains(nack, "protocol") {
				t.Errorf("NACK %q does not say protocol error", nack)
			}
			h.wantProtocolError()
			h.wantEvents("start a", "stop a")
			h.wantPods()
			if h.m.Ready() {
				t.Error("Ready() after Run returned")
			}
			if err := c.WaitClosed(); err != nil {
				t.Errorf("connection after a protocol error: %v", err)
			}
			wantOpenFDs(t, fa, 1)
			wantOpenFDs(t, fx, 1)
		})
	}
}

// TestBadMessagesReconnect: a message the Manager cannot take — not a
// protobuf, no known request, longer than 1024 bytes, an Add without
// exactly one fd, more fds than fit — is NACKed, the connection is dropped
// and remade with a new hello, and the pods keep running.
func TestBadMessagesReconnect(t *testing.T) {
	add := func(fds ...int) func(c *inpodtest.Conn) (string, error) {
		return func(c *inpodtest.Conn) (string, error) {
			return c.Request(inpodtest.AddRequest("x", infoFor("x")), fds...)
		}
	}
	raw := func(b []byte) func(c *inpodtest.Conn) (string, error) {
		return func(c *inpodtest.Conn) (string, error) {
			if err := c.SendRaw(b); err != nil {
				return "", err
			}
			return c.ReadAck()
		}
	}
	fx := newNSFile(t)
	tenFDs := make([]int, 10)
	for i := range tenFDs {
		tenFDs[i] = fx.fd()
	}
	tests := []struct {
		name string
		send func(c *inpodtest.Conn) (string, error)
	}{
		{"not a protobuf", raw([]byte{0xff, 0xff, 0xff})},
		{"unknown request", raw([]byte{0x48, 0x01})}, // field 9, varint 1
		{"longer than 1024 bytes", raw(longKeep())},
		{"add with no fd", add()},
		{"add with two fds", add(fx.fd(), fx.fd())},
		{"add with ten fds", add(tenFDs...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			c := h.accept()
			fa := newNSFile(t)
			ack, err := c.Add("a", infoFor("a"), fa.fd())
			mustAck(t, "Add", ack, err)
			ack, err = c.SnapshotSent()
			mustAck(t, "SnapshotSent", ack, err)
			h.wantReady(true)

			ack, err = tt.send(c)
			mustNack(t, tt.name, ack, err)
			if err := c.WaitClosed(); err != nil {
				t.Fatalf("connection after a bad message: %v", err)
			}
			h.wantReady(false)
			c = h.accept()
			wantOpenFDs(t, fx, 1)
			h.wantEvents("start a")
			h.wantPods(up("a", infoFor("a")))

			ack, err = c.Add("a", infoFor("a"), fa.fd())
			mustAck(t, "Add a again", ack, err)
			ack, err = c.SnapshotSent()
			mustAck(t, "SnapshotSent", ack, err)
			h.wantReady(true)
			h.wantEvents()
		})
	}
}

// longKeep returns a 2006-byte KeepWorkload request whose first 1024 bytes
// are a valid request too, so only the truncation check can refuse it: a
// Keep{uid: "xy"} followed by unknown varint fields (field 15).
func longKeep() []byte {
	b := []byte{0x2a, 0x04, 0x0a, 0x02, 'x', 'y'}
	for range 1000 {
		b = append(b, 0x78, 0x01)
	}
	return b
}

// TestStartFailureRetries: a failed Start is NACKed with its error, the
// pod is Pending (and the Manager not ready) and Start is retried until it
// succeeds.
func TestStartFailureRetries(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.setFail("a", 2)
	c := h.accept()
	f := newNSFile(t)
	ack, err := c.Add("a", infoFor("a"), f.fd())
	nack := mustNack(t, "Add", ack, err)
	if !strings.Contains(nack, "boom for a") {
		t.Errorf("NACK %q does not carry Start's error", nack)
	}
	h.wantEvents("fail a")
	h.wantPods(pending("a", infoFor("a")))
	mustSnapshot(t, c)
	if h.m.Ready() {
		t.Fatal("Ready() with a pending pod")
	}
	h.waitEvent("fail a")
	h.waitEvent("start a")
	h.wantReady(true)
	h.wantPods(up("a", infoFor("a")))
	wantOpenFDs(t, f, 2) // the netns survived the failed starts
}

// TestPendingPodAddedAgainStartsNow: an Add for a pending pod starts it at
// once rather than at the next retry.
func TestPendingPodAddedAgainStartsNow(t *testing.T) {
	h := newHarness(t, func(c *inpod.Config) { c.RetryInterval = time.Hour })
	h.fake.setFail("a", 1)
	c := h.accept()
	f := newNSFile(t)
	ack, err := c.Add("a", infoFor("a"), f.fd())
	mustNack(t, "Add", ack, err)
	ack, err = c.Add("a", infoFor("a"), f.reopen(t).fd())
	mustAck(t, "Add again", ack, err)
	h.wantEvents("fail a", "start a")
	wantOpenFDs(t, f, 3) // ours two and the Manager's second
}

// TestPendingPodDeleted: deleting a pending pod drops it (no Stop: nothing
// runs), closes its netns and makes the Manager ready.
func TestPendingPodDeleted(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.setFail("a", -1)
	c := h.accept()
	f := newNSFile(t)
	ack, err := c.Add("a", infoFor("a"), f.fd())
	mustNack(t, "Add", ack, err)
	mustSnapshot(t, c)
	ack, err = c.Del("a")
	mustAck(t, "Del", ack, err)
	h.wantReady(true)
	h.wantPods()
	wantOpenFDs(t, f, 1)
	for _, e := range h.events() {
		if e != "fail a" {
			t.Errorf("event %q, want only failed starts", e)
		}
	}
}

// TestServerRestartKeepsPods: istio-cni going away (socket removed) leaves
// the pods running and the Manager not ready; it reconnects with backoff
// once istio-cni is back, and the new snapshot makes it ready again.
func TestServerRestartKeepsPods(t *testing.T) {
	h, _, f := upWithPod(t, "a")

	h.srv.Close()
	h.wantReady(false)
	h.wantEvents("start a")
	h.wantPods(up("a", infoFor("a")))

	srv := inpodtest.NewServer(t, h.path)
	c := acceptOn(t, srv)
	ack, err := c.Add("a", infoFor("a"), f.fd())
	mustAck(t, "Add a again", ack, err)
	mustSnapshot(t, c)
	h.wantReady(true)
	h.wantEvents()
	wantOpenFDs(t, f, 2)
}

// TestCancelStopsPods: cancelling Run stops every pod, closes every netns
// and the connection, and Run returns nil.
func TestCancelStopsPods(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.setFail("p", -1)
	c := h.accept()
	fa, fb, fp := newNSFile(t), newNSFile(t), newNSFile(t)
	for uid, f := range map[string]nsFile{"a": fa, "b": fb} {
		ack, err := c.Add(uid, infoFor(uid), f.fd())
		mustAck(t, "Add "+uid, ack, err)
	}
	ack, err := c.Add("p", infoFor("p"), fp.fd())
	mustNack(t, "Add p", ack, err)
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	got := h.events()
	var stops []string
	for _, e := range got {
		if strings.HasPrefix(e, "stop") {
			stops = append(stops, e)
		}
	}
	if len(stops) != 2 || !containsAll(stops, "stop a", "stop b") {
		t.Errorf("events %q, want stop a and stop b", got)
	}
	h.wantPods()
	for _, f := range []nsFile{fa, fb, fp} {
		wantOpenFDs(t, f, 1)
	}
	if err := c.WaitClosed(); err != nil {
		t.Errorf("connection after Run returned: %v", err)
	}
}

func containsAll(list []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, s := range list {
			found = found || s == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestMetrics: the four workload_manager series exist from New at 0 and
// follow starts, failures and stops.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := inpod.New(inpod.Config{Start: newFakeProxies().start, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	wantMetrics(t, reg, map[string]float64{
		"workload_manager_active_proxy_count":    0,
		"workload_manager_pending_proxy_count":   0,
		"workload_manager_proxies_started_total": 0,
		"workload_manager_proxies_stopped_total": 0,
	})
	if _, err := inpod.New(inpod.Config{Start: newFakeProxies().start, Registerer: reg}); err == nil {
		t.Error("second New on one registry succeeded")
	}

	h := newHarness(t, nil)
	h.fake.setFail("p", -1)
	c := h.accept()
	for _, uid := range []string{"a", "b"} {
		ack, err := c.Add(uid, infoFor(uid), newNSFile(t).fd())
		mustAck(t, "Add "+uid, ack, err)
	}
	ack, err := c.Add("p", infoFor("p"), newNSFile(t).fd())
	mustNack(t, "Add p", ack, err)
	wantMetrics(t, h.reg, map[string]float64{
		"workload_manager_active_proxy_count":    2,
		"workload_manager_pending_proxy_count":   1,
		"workload_manager_proxies_started_total": 2,
		"workload_manager_proxies_stopped_total": 0,
	})
	mustSnapshot(t, c)
	h.fake.setFail("p", 0)
	h.wantReady(true) // p started on retry
	ack, err = c.Del("a")
	mustAck(t, "Del a", ack, err)
	wantMetrics(t, h.reg, map[string]float64{
		"workload_manager_active_proxy_count":    2,
		"workload_manager_pending_proxy_count":   0,
		"workload_manager_proxies_started_total": 3,
		"workload_manager_proxies_stopped_total": 1,
	})
}

// wantMetrics checks the value of each named unlabelled gauge or counter.
func wantMetrics(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	got := gatherValues(t, reg)
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("metric %s missing", name)
		} else if g != w {
			t.Errorf("metric %s = %v, want %v", name, g, w)
		}
	}
}

// TestNetnsIdentity: handles on one namespace are Same, on different
// files are not; Inode is the file's.
func TestNetnsIdentity(t *testing.T) {
	a, err := netns.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := netns.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !a.Same(b) {
		t.Error("two handles on this process's netns are not Same")
	}
	if got, want := a.Inode(), nstest.PathInode(t, "/proc/self/ns/net"); got != want {
		t.Errorf("Inode() = %d, want %d", got, want)
	}
	f1, f2 := newNSFile(t), newNSFile(t)
	x, err := netns.Open(f1.path)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	y, err := netns.Open(f2.path)
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	if x.Same(y) || x.Same(a) {
		t.Error("handles on different files are Same")
	}
	if x.Same(nil) || (*netns.Handle)(nil).Same(x) {
		t.Error("Same with nil reported true")
	}
	if _, err := netns.Open("/nonexistent/netns"); err == nil {
		t.Error("netns.Open of a missing path succeeded")
	}
	closed := f1.reopen(t)
	closed.Close()
	if _, err := netns.New(closed.File); err == nil {
		t.Error("netns.New of a closed file succeeded")
	}
	if err := x.Run(func() error { return errors.New("ran") }); err == nil || err.Error() == "ran" {
		t.Errorf("Run in a regular file = %v, want a setns error", err)
	}
}
