package xds_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gozt/gozt/xds"
)

// onDemandHarness is a harness whose client subscribes on demand, on node
// "node-a", with the given demand timeout (0 for the default).
func onDemandHarness(t *testing.T, timeout time.Duration) *harness {
	t.Helper()
	return newHarness(t, func(c *xds.Config) {
		c.OnDemand = true
		c.DemandTimeout = timeout
		c.Node = xds.BuildNode(xds.NodeInfo{PodName: "ztunnel-a", PodNamespace: "istio-system", NodeName: "node-a"})
	})
}

// isSubscribe matches a request subscribing to exactly name.
func isSubscribe(name string) func(*discoveryv3.DeltaDiscoveryRequest) bool {
	return func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		return r.GetTypeUrl() == xds.AddressTypeURL && slices.Equal(r.GetResourceNamesSubscribe(), []string{name})
	}
}

// subscribesBefore counts the requests subscribing to name that arrive
// before the one subscribing to marker (demanded after name's demand
// returned: the stream keeps the order).
func subscribesBefore(h *harness, name, marker string) int {
	h.t.Helper()
	n := 0
	h.srv.NextRequest(h.t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		if isSubscribe(name)(r) {
			n++
		}
		return isSubscribe(marker)(r)
	})
	return n
}

func demandCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestOnDemandInitialRequests: with OnDemand the initial Address request
// subscribes and unsubscribes "*" in one request (subscribe to nothing, as
// ztunnel's construct_initial_request), Authorization stays a wildcard
// subscription, and istiod's answer carries only the node's own workloads.
func TestOnDemandInitialRequests(t *testing.T) {
	h := onDemandHarness(t, 0)
	local := wl("local", 1)
	local.Node = "node-a"
	h.srv.PushWorkload(local, wl("remote", 2))
	h.start()
	addr := h.srv.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool { return r.GetTypeUrl() == xds.AddressTypeURL })
	if !slices.Equal(addr.GetResourceNamesSubscribe(), []string{"*"}) || !slices.Equal(addr.GetResourceNamesUnsubscribe(), []string{"*"}) {
		t.Errorf("Address initial request subscribe %q unsubscribe %q, want [*] and [*]", addr.GetResourceNamesSubscribe(), addr.GetResourceNamesUnsubscribe())
	}
	if addr.GetNode().GetId() == "" {
		t.Error("Address initial request carries no Node")
	}
	authz := h.srv.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool { return r.GetTypeUrl() == xds.AuthorizationTypeURL })
	if len(authz.GetResourceNamesSubscribe())+len(authz.GetResourceNamesUnsubscribe()) != 0 {
		t.Errorf("Authorization initial request subscribe %q unsubscribe %q, want wildcard", authz.GetResourceNamesSubscribe(), authz.GetResourceNamesUnsubscribe())
	}
	h.waitReady()
	waitFor(t, "the node's own workload", func() bool { return h.store.Snapshot().WorkloadByUID("local") != nil })
	if h.store.Snapshot().WorkloadByUID("remote") != nil {
		t.Error("a workload of another node arrived without a demand")
	}
}

// TestOnDemandReadinessIgnoresAddress: readiness waits for the wildcard
// types only (ztunnel's types_to_expect): with the Address answer held
// back and Authorization answered, an on-demand client is ready and a
// wildcard one is not.
func TestOnDemandReadinessIgnoresAddress(t *testing.T) {
	for _, onDemand := range []bool{false, true} {
		t.Run(map[bool]string{false: "wildcard", true: "on-demand"}[onDemand], func(t *testing.T) {
			h := newHarness(t, func(c *xds.Config) { c.OnDemand = onDemand })
			h.srv.HoldAnswers(true)
			h.start()
			h.srv.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool { return r.GetTypeUrl() == xds.AuthorizationTypeURL })
			h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: xds.AuthorizationTypeURL, Nonce: "authz-1"})
			if a := h.answer("authz-1"); a.GetErrorDetail() != nil {
				t.Fatalf("Authorization answer NACKed: %v", a.GetErrorDetail())
			}
			// The client marks a type ACKed after sending the ACK; once a
			// second response is answered, the first one's mark is made,
			// so isReady below cannot run ahead of it.
			h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: xds.AuthorizationTypeURL, Nonce: "authz-2"})
			if a := h.answer("authz-2"); a.GetErrorDetail() != nil {
				t.Fatalf("second Authorization answer NACKed: %v", a.GetErrorDetail())
			}
			if onDemand {
				h.waitReady()
			} else if h.isReady() {
				t.Error("wildcard client ready without an Address answer")
			}
		})
	}
}

// TestDemandSubscribesOnce: a demand sends one request subscribing to the
// key, returns once the answer (named by uid, the key among its aliases)
// is in the store, and a second demand for a key istiod already answered
// sends nothing.
func TestDemandSubscribesOnce(t *testing.T) {
	h := onDemandHarness(t, 0)
	h.srv.PushWorkload(wl("remote", 7))
	h.start()
	h.waitReady()
	ctx := demandCtx(t)
	if err := h.client.Demand(ctx, "/10.0.0.7"); err != nil {
		t.Fatalf("Demand: %v", err)
	}
	w := h.store.Snapshot().WorkloadByIP("", netip.MustParseAddr("10.0.0.7"))
	if w == nil || w.UID != "remote" {
		t.Fatalf("after Demand the store holds %v, want workload remote", w)
	}
	if err := h.client.Demand(ctx, "/10.0.0.7"); err != nil {
		t.Fatalf("second Demand: %v", err)
	}
	if err := h.client.Demand(ctx, "/10.0.0.200"); err != nil {
		t.Fatalf("marker Demand: %v", err)
	}
	if n := subscribesBefore(h, "/10.0.0.7", "/10.0.0.200"); n != 1 {
		t.Errorf("%d requests subscribed /10.0.0.7, want 1", n)
	}
}

// TestDemandConcurrentShare: concurrent demands for one key share one
// request, and none returns before the answer is in the store.
func TestDemandConcurrentShare(t *testing.T) {
	h := onDemandHarness(t, 0)
	h.srv.PushWorkload(wl("remote", 8))
	h.start()
	h.waitReady()
	h.srv.HoldAnswers(true)
	ctx := demandCtx(t)
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.client.Demand(ctx, "remote"); err != nil {
				errs <- err
				return
			}
			if h.store.Snapshot().WorkloadByUID("remote") == nil {
				errs <- errors.New("Demand returned before the workload was stored")
			}
		}()
	}
	waitFor(t, "every demand to wait", func() bool { return xds.DemandWaiters(h.client, "remote") == n })
	h.srv.HoldAnswers(false)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := h.client.Demand(ctx, "/10.0.0.201"); err != nil {
		t.Fatalf("marker Demand: %v", err)
	}
	if got := subscribesBefore(h, "remote", "/10.0.0.201"); got != 1 {
		t.Errorf("%d requests subscribed remote, want 1", got)
	}
}

// TestDemandUnknownName: istiod answers a name it does not know with a
// removal; the demand returns nil on that answer and the store is unchanged.
// Neither limit can end it instead: the demand timeout (a minute) would fail
// it with ErrDemandTimeout and the context's end (demandCtx) with its error.
func TestDemandUnknownName(t *testing.T) {
	h := onDemandHarness(t, time.Minute)
	h.start()
	h.waitReady()
	if err := h.client.Demand(demandCtx(t), "demo/nothing.demo.svc.cluster.local"); err != nil {
		t.Fatalf("Demand: %v", err)
	}
	if w, s, _ := stateKeys(h.store); len(w)+len(s) != 0 {
		t.Errorf("store holds %v %v after an unknown name", w, s)
	}
}

// TestDemandSilentServer: when istiod does not answer, Demand returns
// ErrDemandTimeout after Config.DemandTimeout, or the context's error
// when it ends first.
func TestDemandSilentServer(t *testing.T) {
	h := onDemandHarness(t, 200*time.Millisecond)
	h.srv.PushWorkload(wl("remote", 9))
	h.start()
	h.waitReady()
	h.srv.HoldAnswers(true)
	if err := h.client.Demand(demandCtx(t), "remote"); !errors.Is(err, xds.ErrDemandTimeout) {
		t.Errorf("Demand with a silent server = %v, want ErrDemandTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.client.Demand(ctx, "remote"); !errors.Is(err, context.Canceled) {
		t.Errorf("Demand with a cancelled context = %v, want context.Canceled", err)
	}
	// The answer, once sent, still lands.
	h.srv.HoldAnswers(false)
	waitFor(t, "the late answer", func() bool { return h.store.Snapshot().WorkloadByUID("remote") != nil })
}

// TestDemandReconnect: after a reconnect the demanded names are
// re-subscribed through initial_resource_versions (at version "", as
// ztunnel's add_pending_resource), next to the held resources' versions,
// with subscribe and unsubscribe "*" again; a demand waiting across the
// reconnect is answered by the new stream's first response.
func TestDemandReconnect(t *testing.T) {
	h := onDemandHarness(t, 0)
	h.srv.PushWorkload(wl("remote", 10))
	h.start()
	h.waitReady()
	ctx := demandCtx(t)
	if err := h.client.Demand(ctx, "/10.0.0.10"); err != nil {
		t.Fatal(err)
	}
	h.srv.HoldAnswers(true)
	h.srv.PushWorkload(wl("late", 11))
	done := make(chan error, 1)
	go func() { done <- h.client.Demand(ctx, "late") }()
	h.srv.NextRequest(t, isSubscribe("late"))
	h.srv.CloseStreams(status.Error(codes.Unavailable, "transport is closing"))
	req := h.nextReconnect(xds.AddressTypeURL)
	h.srv.HoldAnswers(false)
	got := req.GetInitialResourceVersions()
	if v, ok := got["/10.0.0.10"]; !ok || v != "" {
		t.Errorf("initial_resource_versions[/10.0.0.10] = %q, %v; want \"\"", v, ok)
	}
	if v, ok := got["late"]; !ok || v != "" {
		t.Errorf("initial_resource_versions[late] = %q, %v; want \"\"", v, ok)
	}
	if got["remote"] == "" {
		t.Errorf("initial_resource_versions lacks the held workload's version: %v", got)
	}
	if !slices.Equal(req.GetResourceNamesSubscribe(), []string{"*"}) || !slices.Equal(req.GetResourceNamesUnsubscribe(), []string{"*"}) {
		t.Errorf("reconnect subscribe %q unsubscribe %q, want [*] and [*]", req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	}
	if err := <-done; err != nil {
		t.Fatalf("demand across the reconnect: %v", err)
	}
	if h.store.Snapshot().WorkloadByUID("late") == nil {
		t.Error("the workload demanded across the reconnect is not stored")
	}
}

// TestDemandOff: without OnDemand, Demand refuses at once.
func TestDemandOff(t *testing.T) {
	h := newHarness(t, nil)
	if err := h.client.Demand(context.Background(), "x"); !errors.Is(err, xds.ErrOnDemandOff) {
		t.Errorf("Demand = %v, want ErrOnDemandOff", err)
	}
}

// TestDemandForgetsUnknownNames: istiod answers a name it does not know
// with a removal; the client then unsubscribes it (istiod would otherwise
// keep it watched for the stream's life) and keeps it in neither of its
// sets, so demands for addresses that do not exist, as a peer naming
// random IPs makes, leave no state on either side. A forgotten name
// demanded again is asked again, and found once it exists. Before issue
// 36 every name stayed in both sets for good.
func TestDemandForgetsUnknownNames(t *testing.T) {
	h := onDemandHarness(t, 0)
	h.start()
	h.waitReady()
	ctx := demandCtx(t)
	const n = 300
	for i := range n {
		if err := h.client.Demand(ctx, fmt.Sprintf("/10.9.%d.%d", i>>8, i&0xff)); err != nil {
			t.Fatalf("Demand: %v", err)
		}
	}
	unsubscribed := make(map[string]bool)
	for len(unsubscribed) < n {
		r := h.srv.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
			return r.GetTypeUrl() == xds.AddressTypeURL && r.GetResponseNonce() == "" &&
				len(r.GetResourceNamesUnsubscribe()) > 0 && len(r.GetResourceNamesSubscribe()) == 0
		})
		for _, name := range r.GetResourceNamesUnsubscribe() {
			unsubscribed[name] = true
		}
	}
	if sub, on := xds.DemandSets(h.client); sub != 0 || on != 0 {
		t.Errorf("after %d unknown names the client keeps %d subscribed and %d on the stream, want 0 and 0", n, sub, on)
	}

	// Forgotten, asked again, and found once the workload exists.
	const key = "/10.0.0.7"
	if err := h.client.Demand(ctx, key); err != nil {
		t.Fatalf("Demand(%s) before the workload exists: %v", key, err)
	}
	waitFor(t, "the unknown name to be forgotten", func() bool { sub, on := xds.DemandSets(h.client); return sub+on == 0 })
	h.srv.PushWorkload(wl("remote", 7))
	if err := h.client.Demand(ctx, key); err != nil {
		t.Fatalf("Demand(%s) again: %v", key, err)
	}
	if w := h.store.Snapshot().WorkloadByIP("", netip.MustParseAddr("10.0.0.7")); w == nil || w.UID != "remote" {
		t.Errorf("after the second demand the store holds %v, want workload remote", w)
	}
	if sub, on := xds.DemandSets(h.client); sub != 1 || on != 1 {
		t.Errorf("a found name: %d subscribed, %d on the stream, want 1 and 1", sub, on)
	}
}
