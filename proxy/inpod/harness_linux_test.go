package inpod_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/proxy/netns"
)

// waitTimeout bounds every wait for something asynchronous to happen.
const waitTimeout = 5 * time.Second

// fakeProxies is a StartFunc that records what the Manager asks of it as
// events ("start a", "fail a", "stop a"), in order.
type fakeProxies struct {
	events chan string

	mu   sync.Mutex
	fail map[string]int // uid → failures left before Start succeeds; -1: forever
	pods map[string]*fakePod
}

type fakePod struct {
	f    *fakeProxies
	uid  string
	info inpod.WorkloadInfo
	ns   *netns.Handle
}

func newFakeProxies() *fakeProxies {
	return &fakeProxies{
		events: make(chan string, 1000),
		fail:   make(map[string]int),
		pods:   make(map[string]*fakePod),
	}
}

func (f *fakeProxies) start(uid string, info inpod.WorkloadInfo, ns *netns.Handle) (inpod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.fail[uid]; n != 0 {
		if n > 0 {
			f.fail[uid] = n - 1
		}
		f.events <- "fail " + uid
		return nil, fmt.Errorf("boom for %s", uid)
	}
	if _, dup := f.pods[uid]; dup {
		f.events <- "double start " + uid
	}
	p := &fakePod{f: f, uid: uid, info: info, ns: ns}
	f.pods[uid] = p
	f.events <- "start " + uid
	return p, nil
}

func (p *fakePod) Stop() {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if p.f.pods[p.uid] == p {
		delete(p.f.pods, p.uid)
	}
	p.f.events <- "stop " + p.uid
}

// setFail makes uid's next n Starts fail (-1: all of them).
func (f *fakeProxies) setFail(uid string, n int) {
	f.mu.Lock()
	f.fail[uid] = n
	f.mu.Unlock()
}

// pod returns uid's running fake pod, or nil.
func (f *fakeProxies) pod(uid string) *fakePod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pods[uid]
}

// harness runs a Manager against a fake istio-cni.
type harness struct {
	t      *testing.T
	path   string
	srv    *inpodtest.Server
	m      *inpod.Manager
	fake   *fakeProxies
	reg    *prometheus.Registry
	ready  chan bool
	done   chan error
	cancel context.CancelFunc
}

// newHarness starts a fake server and a Manager connecting to it; mod, if
// not nil, adjusts the Config first. Cleanup stops the Manager.
func newHarness(t *testing.T, mod func(*inpod.Config)) *harness {
	t.Helper()
	// Socket paths are limited to 108 bytes; t.TempDir can be longer.
	dir, err := os.MkdirTemp("", "inpod")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &harness{
		t:     t,
		path:  filepath.Join(dir, "zds.sock"),
		fake:  newFakeProxies(),
		reg:   prometheus.NewRegistry(),
		ready: make(chan bool, 1000),
		done:  make(chan error, 1),
	}
	h.srv = inpodtest.NewServer(t, h.path)
	cfg := inpod.Config{
		Path:          h.path,
		Start:         h.fake.start,
		Logger:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:    h.reg,
		OnReady:       func(r bool) { h.ready <- r },
		RetryInterval: 20 * time.Millisecond,
		MinBackoff:    5 * time.Millisecond,
		MaxBackoff:    50 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	h.m, err = inpod.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return %v after cancel", waitTimeout)
		}
	})
	return h
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", b)
	return len(b), nil
}

// accept returns the Manager's next connection to the fake server (whose
// hello inpodtest has checked).
func (h *harness) accept() *inpodtest.Conn {
	h.t.Helper()
	return acceptOn(h.t, h.srv)
}

func acceptOn(t *testing.T, srv *inpodtest.Server) *inpodtest.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := srv.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	return c
}

// stop cancels Run and returns its result.
func (h *harness) stop() error {
	h.t.Helper()
	h.cancel()
	return h.runResult()
}

// runResult waits for Run to return.
func (h *harness) runResult() error {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.done <- err // for Cleanup
		return err
	case <-time.After(waitTimeout):
		h.t.Fatalf("Run did not return within %v", waitTimeout)
		return nil
	}
}

// nextReady returns the next readiness change reported to OnReady.
func (h *harness) nextReady() bool {
	h.t.Helper()
	select {
	case r := <-h.ready:
		return r
	case <-time.After(waitTimeout):
		h.t.Fatalf("no readiness change within %v", waitTimeout)
		return false
	}
}

// wantReady checks that the next readiness change is to want.
func (h *harness) wantReady(want bool) {
	h.t.Helper()
	if got := h.nextReady(); got != want {
		h.t.Fatalf("readiness changed to %v, want %v", got, want)
	}
	if got := h.m.Ready(); got != want {
		h.t.Fatalf("Ready() = %v right after OnReady(%v)", got, want)
	}
}

// noReadyChange checks that no readiness change is queued.
func (h *harness) noReadyChange() {
	h.t.Helper()
	select {
	case r := <-h.ready:
		h.t.Fatalf("unexpected readiness change to %v", r)
	default:
	}
}

// events returns the fake's events so far. Start and Stop happen before
// the Ack they cause, so after an Ack its events are all here.
func (h *harness) events() []string {
	var evs []string
	for {
		select {
		case e := <-h.fake.events:
			evs = append(evs, e)
		default:
			return evs
		}
	}
}

// wantEvents checks the events so far, in order.
func (h *harness) wantEvents(want ...string) {
	h.t.Helper()
	if got := h.events(); !slices.Equal(got, want) {
		h.t.Fatalf("events = %q, want %q", got, want)
	}
}

// wantEventSet checks the events so far, in any order (concurrent Stops).
func (h *harness) wantEventSet(want ...string) {
	h.t.Helper()
	got := h.events()
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		h.t.Fatalf("events = %q, want (any order) %q", got, want)
	}
}

// waitEvent waits for the next event and checks it is want.
func (h *harness) waitEvent(want string) {
	h.t.Helper()
	select {
	case got := <-h.fake.events:
		if got != want {
			h.t.Fatalf("event %q, want %q", got, want)
		}
	case <-time.After(waitTimeout):
		h.t.Fatalf("no event within %v, want %q", waitTimeout, want)
	}
}

// wantPods checks Pods().
func (h *harness) wantPods(want ...inpod.PodState) {
	h.t.Helper()
	got := h.m.Pods()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		h.t.Fatalf("Pods() = %+v, want %+v", got, want)
	}
}

// nsFile is a stand-in for a pod netns: a file of its own inode. The
// Manager compares namespaces by inode and device and the fake Start never
// enters them, so any file will do.
type nsFile struct {
	*os.File
	path string
}

func newNSFile(t *testing.T) nsFile {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "netns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return nsFile{File: f, path: f.Name()}
}

// reopen opens another descriptor on the same file: the same netns.
func (f nsFile) reopen(t *testing.T) nsFile {
	t.Helper()
	g, err := os.Open(f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return nsFile{File: g, path: f.path}
}

func (f nsFile) fd() int { return int(f.Fd()) }

// openFDs returns how many of this process's descriptors refer to path.
func openFDs(t *testing.T, path string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == path {
			n++
		}
	}
	return n
}

// wantOpenFDs checks how many descriptors refer to f's file.
func wantOpenFDs(t *testing.T, f nsFile, want int) {
	t.Helper()
	if got := openFDs(t, f.path); got != want {
		t.Fatalf("%d descriptors open on %s, want %d", got, f.path, want)
	}
}

// mustAck checks that a request was acked with success.
func mustAck(t *testing.T, what string, ackErr string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if ackErr != "" {
		t.Fatalf("%s: NACK %q, want success", what, ackErr)
	}
}

// mustNack checks that a request was NACKed and returns the error text.
func mustNack(t *testing.T, what string, ackErr string, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if ackErr == "" {
		t.Fatalf("%s: acked with success, want a NACK", what)
	}
	return ackErr
}

func up(uid string, info inpod.WorkloadInfo) inpod.PodState {
	return inpod.PodState{UID: uid, Info: info, State: inpod.StateUp}
}

func pending(uid string, info inpod.WorkloadInfo) inpod.PodState {
	return inpod.PodState{UID: uid, Info: info, State: inpod.StatePending}
}

func infoFor(uid string) inpod.WorkloadInfo {
	return inpod.WorkloadInfo{Name: "pod-" + uid, Namespace: "ns-" + uid, ServiceAccount: "sa-" + uid}
}

// upWithPod starts a harness whose Manager has been handed pod uid (a fresh
// netns) and the snapshot, both acked, and is ready.
func upWithPod(t *testing.T, uid string) (*harness, *inpodtest.Conn, nsFile) {
	t.Helper()
	h := newHarness(t, nil)
	c := h.accept()
	f := newNSFile(t)
	ack, err := c.Add(uid, infoFor(uid), f.fd())
	mustAck(t, "Add", ack, err)
	mustSnapshot(t, c)
	h.wantReady(true)
	return h, c, f
}

// mustSnapshot sends SnapshotSent and requires a successful ack.
func mustSnapshot(t *testing.T, c *inpodtest.Conn) {
	t.Helper()
	ack, err := c.SnapshotSent()
	mustAck(t, "SnapshotSent", ack, err)
}

// wantProtocolError checks that Run ended with an error wrapping
// ErrProtocol.
func (h *harness) wantProtocolError() {
	h.t.Helper()
	err := h.runResult()
	if !errors.Is(err, inpod.ErrProtocol) {
		h.t.Fatalf("Run = %v, want an error wrapping ErrProtocol", err)
	}
}
