package xds_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
	"github.com/gozt/gozt/xds/xdstest"
)

// TestInitialRequests checks what the client sends when a stream opens
// (SPEC §5.1, §5.2): one wildcard request per type with the Node, and the
// token (read afresh for every stream), clusterid and extra headers as
// metadata.
func TestInitialRequests(t *testing.T) {
	var tokens atomic.Int32
	node := xds.BuildNode(xds.NodeInfo{
		InstanceIP: "10.1.2.3", PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node-1",
		Meta: map[string]string{"CLUSTER_ID": "cluster-1"},
	})
	h := newHarness(t, func(c *xds.Config) {
		c.Token = func() (string, error) { return fmt.Sprintf("tok%d", tokens.Add(1)), nil }
		c.ClusterID = "cluster-1"
		c.Headers = map[string]string{"X-Extra": "v"}
		c.Node = node
	})
	h.start()

	var types []string
	for range 2 {
		r := h.srv.NextRequest(t, nil)
		types = append(types, r.GetTypeUrl())
		if got, want := r.GetNode().GetId(), "ztunnel~10.1.2.3~ztunnel-abc.istio-system~istio-system.svc.cluster.local"; got != want {
			t.Errorf("node id = %q, want %q", got, want)
		}
		md := r.GetNode().GetMetadata().GetFields()
		for k, want := range map[string]string{
			"NAME": "ztunnel-abc", "NAMESPACE": "istio-system", "INSTANCE_IPS": "10.1.2.3",
			"NODE_NAME": "node-1", "CLUSTER_ID": "cluster-1",
		} {
			if got := md[k].GetStringValue(); got != want {
				t.Errorf("node metadata %s = %q, want %q", k, got, want)
			}
		}
		if len(r.GetResourceNamesSubscribe())+len(r.GetResourceNamesUnsubscribe()) != 0 {
			t.Errorf("initial request subscribes %v, unsubscribes %v; want wildcard (none)",
				r.GetResourceNamesSubscribe(), r.GetResourceNamesUnsubscribe())
		}
		if r.GetResponseNonce() != "" || len(r.GetInitialResourceVersions()) != 0 || r.GetErrorDetail() != nil {
			t.Errorf("first initial request = %v; want no nonce, versions or error", r)
		}
	}
	slices.Sort(types)
	if want := []string{xds.AuthorizationTypeURL, xds.AddressTypeURL}; !slices.Equal(types, want) {
		t.Errorf("initial request types = %v, want %v", types, want)
	}

	h.srv.CloseStreams(nil)
	waitFor(t, "second stream", func() bool { return h.srv.Connections() == 2 })
	mds := h.srv.Metadata()
	for i, want := range []string{"Bearer tok1", "Bearer tok2"} {
		md := mds[i]
		if got := md.Get("authorization"); !slices.Equal(got, []string{want}) {
			t.Errorf("stream %d authorization = %q, want %q", i, got, want)
		}
		if got := md.Get("clusterid"); !slices.Equal(got, []string{"cluster-1"}) {
			t.Errorf("stream %d clusterid = %q, want cluster-1", i, got)
		}
		if got := md.Get("x-extra"); !slices.Equal(got, []string{"v"}) {
			t.Errorf("stream %d x-extra = %q, want v", i, got)
		}
	}
}

func TestNoTokenNoAuthMetadata(t *testing.T) {
	h := newHarness(t, func(c *xds.Config) { c.ClusterID = "cluster-1" })
	h.start()
	h.waitReady()
	md := h.srv.Metadata()[0]
	if md.Get("authorization") != nil || md.Get("clusterid") != nil {
		t.Errorf("metadata without a token source = %v; want no authorization or clusterid", md)
	}
}

func TestTokenErrorIsConnectionError(t *testing.T) {
	h := newHarness(t, func(c *xds.Config) {
		c.Token = func() (string, error) { return "", errors.New("no token file") }
	})
	h.start()
	waitFor(t, "two ConnectionError terminations", func() bool {
		return h.counter("istio_xds_connection_terminations_total", "ConnectionError") >= 2
	})
	if n := h.srv.Connections(); n != 0 {
		t.Errorf("streams opened without a token = %d, want 0", n)
	}
}

func TestBuildNode(t *testing.T) {
	n := xds.BuildNode(xds.NodeInfo{
		PodName: "p", PodNamespace: "ns",
		Meta:     map[string]string{"ISTIO_VERSION": "1.28", "NAME": "override"},
		MetaJSON: map[string]any{"LIST": []any{"a", 1.5, true, nil}, "OBJ": map[string]any{"k": "v"}},
	})
	if got, want := n.GetId(), "ztunnel~1.1.1.1~p.ns~ns.svc.cluster.local"; got != want {
		t.Errorf("id = %q, want %q", got, want)
	}
	if n.GetCluster() != "" {
		t.Errorf("cluster = %q, want empty", n.GetCluster())
	}
	want := map[string]any{
		"NAME": "override", "NAMESPACE": "ns", "INSTANCE_IPS": "1.1.1.1", "NODE_NAME": "", "ISTIO_VERSION": "1.28",
		"LIST": []any{"a", 1.5, true, nil}, "OBJ": map[string]any{"k": "v"},
	}
	if diff := cmp.Diff(want, n.GetMetadata().AsMap()); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}
	if _, ok := n.GetMetadata().GetFields()["NAMESPACE"].GetKind().(*structpb.Value_StringValue); !ok {
		t.Error("NAMESPACE is not a string value")
	}
}

// TestAckNack covers ACK and NACK nonces, partial NACKs and the xDS bad
// inputs 38 (undecodable Any, wrong type URL) and 39 (bad workloads).
func TestAckNack(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.waitReady()

	h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{
		TypeUrl: xds.AddressTypeURL, Nonce: "n-good",
		Resources: []*discoveryv3.Resource{xdstest.WorkloadResource(wl("a", 1))},
	})
	if ack := h.answer("n-good"); ack.GetErrorDetail() != nil || ack.GetTypeUrl() != xds.AddressTypeURL {
		t.Fatalf("answer to a good push = %v, want an ACK for %s", ack, xds.AddressTypeURL)
	}
	if h.store.Snapshot().WorkloadByUID("a") == nil {
		t.Fatal("workload a not in the store after its ACK")
	}

	wrongType, _ := anypb.New(&security.Authorization{Name: "x", Namespace: "ns"})
	bad5 := wl("bad-ip", 2)
	bad5.Addresses = [][]byte{{1, 2, 3, 4, 5}}
	legacy := wl("legacy", 3)
	legacy.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS
	port := wl("port", 4)
	port.Services = map[string]*workloadapi.PortList{"ns/s": {Ports: []*workloadapi.Port{{ServicePort: 70000}}}}
	misnamed := xdstest.WorkloadResource(wl("c", 5))
	misnamed.Name = "not-c"
	noUID := xdstest.WorkloadResource(&workloadapi.Workload{Name: "x", Namespace: "ns"})
	noUID.Name = "no-uid"
	h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{
		TypeUrl: xds.AddressTypeURL, Nonce: "n-partial",
		Resources: []*discoveryv3.Resource{
			xdstest.WorkloadResource(wl("b", 6)),
			{Name: "undecodable", Resource: &anypb.Any{TypeUrl: xds.AddressTypeURL, Value: []byte{0xff, 0xff, 0xff}}},
			{Name: "wrong-type", Resource: wrongType},
			{Name: "empty"},
			xdstest.WorkloadResource(bad5),
			xdstest.WorkloadResource(legacy),
			xdstest.WorkloadResource(port),
			misnamed,
			noUID,
			xdstest.WorkloadResource(wl("b", 7)), // duplicate name in one response
			xdstest.ServiceResource(svcProto("svc", 1)),
		},
	})
	nack := h.answer("n-partial")
	if nack.GetErrorDetail() == nil {
		t.Fatalf("answer to a partly bad push = %v, want a NACK", nack)
	}
	var named []string
	for _, part := range strings.Split(nack.GetErrorDetail().GetMessage(), "; ") {
		name, reason, ok := strings.Cut(part, ": ")
		if !ok || reason == "" {
			t.Errorf("NACK entry %q is not \"name: reason\"", part)
		}
		named = append(named, name)
	}
	wantNamed := []string{"undecodable", "wrong-type", "empty", "bad-ip", "legacy", "port", "not-c", "no-uid", "b"}
	if !slices.Equal(named, wantNamed) {
		t.Errorf("NACK names %q, want %q (message %q)", named, wantNamed, nack.GetErrorDetail().GetMessage())
	}
	for _, want := range []string{"LEGACY_ISTIO_MTLS", "port 70000", "5 bytes", "duplicate", `key "c"`, "empty uid"} {
		if !strings.Contains(nack.GetErrorDetail().GetMessage(), want) {
			t.Errorf("NACK message %q does not mention %q", nack.GetErrorDetail().GetMessage(), want)
		}
	}
	snap := h.store.Snapshot()
	if w := snap.WorkloadByUID("b"); w == nil || w.Addresses[0].As4()[3] != 6 {
		t.Errorf("workload b = %+v; want the first copy (10.0.0.6) applied", w)
	}
	if snap.ServiceByKey("ns/svc") == nil {
		t.Error("service ns/svc not applied alongside rejected resources")
	}
	gotW, _, _ := stateKeys(h.store)
	if want := []string{"a", "b"}; !slices.Equal(gotW, want) {
		t.Errorf("workloads = %v, want %v", gotW, want)
	}
	if got := h.counter("istio_xds_message_total", xds.AddressTypeURL); got != 3 {
		t.Errorf("istio_xds_message_total{Address} = %v, want 3 (initial + 2 pushes)", got)
	}
}

// TestReadyNeedsBothTypes: Ready waits for an ACK of each type; a NACKed
// first response does not count.
func TestReadyNeedsBothTypes(t *testing.T) {
	h := newHarness(t, nil)
	bad := wl("bad", 1)
	bad.Addresses = [][]byte{{1}}
	h.srv.PushWorkload(bad)
	h.srv.PushPolicy(policyProto("p"))
	h.start()

	answers := map[string]*discoveryv3.DeltaDiscoveryRequest{}
	for len(answers) < 2 {
		r := h.srv.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool { return r.GetResponseNonce() != "" })
		answers[r.GetTypeUrl()] = r
	}
	if ack := answers[xds.AuthorizationTypeURL]; ack.GetErrorDetail() != nil {
		t.Fatalf("policy answer = %v, want ACK", ack)
	}
	if nack := answers[xds.AddressTypeURL]; nack.GetErrorDetail() == nil {
		t.Fatalf("address answer = %v, want NACK", nack)
	}
	time.Sleep(20 * time.Millisecond)
	if h.isReady() {
		t.Fatal("Ready closed with only Authorization ACKed")
	}
	if ack := h.answer(h.srv.PushWorkload(wl("good", 2))); ack.GetErrorDetail() != nil {
		t.Fatalf("answer = %v, want ACK", ack)
	}
	h.waitReady()
}

func TestRemovals(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushWorkload(wl("a", 1), wl("b", 2))
	h.srv.PushService(svcProto("svc", 1))
	h.srv.PushPolicy(policyProto("p"), policyProto("q"))
	h.start()
	h.waitReady()

	n1 := h.srv.Remove(xds.AddressTypeURL, "a", "ns/svc", "never-existed", "ns/q")
	n2 := h.srv.Remove(xds.AuthorizationTypeURL, "ns/p", "ns/unknown", "b")
	for _, n := range []string{n1, n2} {
		if a := h.answer(n); a.GetErrorDetail() != nil {
			t.Errorf("answer to removals = %v, want ACK", a)
		}
	}
	w, s, p := stateKeys(h.store)
	// An Address removal never removes a policy, and an Authorization
	// removal never removes a workload, even with a matching name.
	if diff := cmp.Diff([][]string{{"b"}, nil, {"ns/q"}}, [][]string{w, s, p}); diff != "" {
		t.Errorf("state after removals (-want +got):\n%s", diff)
	}
}

// TestReconnectCarriesHeldVersions: the initial requests after a reconnect
// list the version of every resource held, not the versions that were
// NACKed (TESTPLAN 38), and the server then sends nothing that is unchanged.
func TestReconnectCarriesHeldVersions(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushWorkload(wl("a", 1), wl("x", 2))
	h.srv.PushService(svcProto("svc", 1))
	h.srv.PushPolicy(policyProto("p"))
	h.start()
	h.waitReady()
	held := h.srv.Resources(xds.AddressTypeURL)

	// x gets a bad update and "bad" never was good: both NACKed.
	badX := wl("x", 2)
	badX.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS
	if nack := h.answer(h.srv.PushWorkload(badX)); nack.GetErrorDetail() == nil {
		t.Fatalf("answer = %v, want NACK", nack)
	}
	bad := wl("bad", 3)
	bad.Addresses = [][]byte{{}}
	if nack := h.answer(h.srv.PushWorkload(bad)); nack.GetErrorDetail() == nil {
		t.Fatalf("answer = %v, want NACK", nack)
	}

	h.srv.CloseStreams(nil)
	r := h.nextReconnect(xds.AddressTypeURL)
	want := map[string]string{"a": held["a"], "x": held["x"], "ns/svc": held["ns/svc"]}
	if diff := cmp.Diff(want, r.GetInitialResourceVersions()); diff != "" {
		t.Errorf("Address initial_resource_versions (-want +got):\n%s", diff)
	}
	r = h.nextReconnect(xds.AuthorizationTypeURL)
	if diff := cmp.Diff(h.srv.Resources(xds.AuthorizationTypeURL), r.GetInitialResourceVersions()); diff != "" {
		t.Errorf("Authorization initial_resource_versions (-want +got):\n%s", diff)
	}
	if got := h.store.Snapshot().WorkloadByUID("x"); got == nil || got.Protocol != state.TunnelHBONE {
		t.Errorf("workload x = %+v, want the accepted HBONE version kept", got)
	}
}

// TestReconnectSkipsUnchanged: with nothing changed, the reconnect carries
// no resource payload at all (TESTPLAN F3, "no full push").
func TestReconnectSkipsUnchanged(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushWorkload(wl("a", 1), wl("b", 2))
	h.srv.PushPolicy(policyProto("p"))
	h.start()
	h.waitReady()
	bytesBefore := h.counter("istio_xds_message_bytes_total", xds.AddressTypeURL) +
		h.counter("istio_xds_message_bytes_total", xds.AuthorizationTypeURL)
	if bytesBefore == 0 {
		t.Fatal("istio_xds_message_bytes_total is 0 after the initial push")
	}

	h.srv.CloseStreams(nil)
	waitFor(t, "the second stream's responses", func() bool {
		return h.counter("istio_xds_message_total", xds.AddressTypeURL) == 2 &&
			h.counter("istio_xds_message_total", xds.AuthorizationTypeURL) == 2
	})
	bytesAfter := h.counter("istio_xds_message_bytes_total", xds.AddressTypeURL) +
		h.counter("istio_xds_message_bytes_total", xds.AuthorizationTypeURL)
	if bytesAfter != bytesBefore {
		t.Errorf("payload bytes after an unchanged reconnect = %v, want %v", bytesAfter, bytesBefore)
	}
	if w, _, _ := stateKeys(h.store); !slices.Equal(w, []string{"a", "b"}) {
		t.Errorf("workloads after reconnect = %v", w)
	}
}

// TestReconnectRemovesWhatServerDropped: a resource removed while the client
// was away is removed on reconnect.
func TestReconnectRemovesWhatServerDropped(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushWorkload(wl("a", 1), wl("b", 2))
	h.start()
	h.waitReady()
	h.down.Store(true)
	h.srv.CloseStreams(nil)
	h.srv.Remove(xds.AddressTypeURL, "a")
	h.srv.PushWorkload(wl("c", 3))
	waitFor(t, "a failed dial", func() bool { return h.counter("istio_xds_connection_terminations_total", "ConnectionError") >= 1 })
	h.down.Store(false)
	waitFor(t, "state to follow the server", func() bool {
		w, _, _ := stateKeys(h.store)
		return slices.Equal(w, []string{"b", "c"})
	})
}

// TestStaleNonceAndUnknownNames: TESTPLAN 45. Nonces are opaque (a repeated
// one is simply answered), unknown removals are ignored, and a type that
// was not subscribed is NACKed without touching the state.
func TestStaleNonceAndUnknownNames(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushWorkload(wl("a", 1))
	// A workload from another source (the local config) is not xDS's to
	// remove.
	h.store.Update(func(b *state.Batch) {
		if err := b.InsertWorkload(&state.Workload{UID: "local", Name: "local", Namespace: "ns"}); err != nil {
			t.Fatal(err)
		}
	})
	h.start()
	h.waitReady()

	for range 2 {
		h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{
			TypeUrl: xds.AddressTypeURL, Nonce: "n-stale",
			Resources:        []*discoveryv3.Resource{xdstest.WorkloadResource(wl("b", 2))},
			RemovedResources: []string{"nope", "ns/nope", "local"},
		})
		if a := h.answer("n-stale"); a.GetErrorDetail() != nil {
			t.Errorf("answer = %v, want ACK", a)
		}
	}
	h.srv.Send(&discoveryv3.DeltaDiscoveryResponse{
		TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "n-cds",
		RemovedResources: []string{"a"},
	})
	if a := h.answer("n-cds"); !strings.Contains(a.GetErrorDetail().GetMessage(), "unsubscribed type") {
		t.Errorf("answer to an unsubscribed type = %v, want NACK", a)
	}
	if w, _, _ := stateKeys(h.store); !slices.Equal(w, []string{"a", "b", "local"}) {
		t.Errorf("workloads = %v, want [a b local]", w)
	}
	if got := h.counter("istio_xds_message_total", "unknown"); got != 1 {
		t.Errorf(`istio_xds_message_total{url="unknown"} = %v, want 1`, got)
	}
}

// TestUnknownActionNacked: TESTPLAN 40. A policy with an action we do not
// know is refused (never applied as ALLOW), and the others are kept.
func TestUnknownActionNacked(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.PushPolicy(policyProto("p"))
	h.start()
	h.waitReady()
	odd := policyProto("odd")
	odd.Action = 3
	nack := h.answer(h.srv.PushPolicy(odd, policyProto("q")))
	if !strings.HasPrefix(nack.GetErrorDetail().GetMessage(), "ns/odd: ") || !strings.Contains(nack.GetErrorDetail().GetMessage(), "unknown action 3") {
		t.Errorf("answer = %v, want NACK of ns/odd for its action", nack)
	}
	if _, _, p := stateKeys(h.store); !slices.Equal(p, []string{"ns/p", "ns/q"}) {
		t.Errorf("policies = %v, want [ns/p ns/q]", p)
	}
}

// TestWrongServerName: TESTPLAN 46. A server whose certificate does not
// match the name we expect is never talked to.
func TestWrongServerName(t *testing.T) {
	h := newHarness(t, func(c *xds.Config) {
		c.TLS = c.TLS.Clone()
		c.TLS.ServerName = "not-istiod.example"
	})
	h.start()
	waitFor(t, "two ConnectionError terminations", func() bool {
		return h.counter("istio_xds_connection_terminations_total", "ConnectionError") >= 2
	})
	if n := h.srv.Connections(); n != 0 {
		t.Errorf("streams opened with a wrong server name = %d, want 0", n)
	}
	if h.isReady() {
		t.Error("Ready without a server")
	}
}

// TestReconnectTiming: F5/TESTPLAN 44. A stream ended with OK or a benign
// status is reopened after the initial delay every time; an error doubles
// the delay each time.
func TestReconnectTiming(t *testing.T) {
	const initial = 50 * time.Millisecond
	tests := []struct {
		name       string
		err        error
		reason     string
		growing    bool
		maxLastGap time.Duration
	}{
		{"ok", nil, "Complete", false, 6 * initial},
		{"benign", status.Error(codes.Unavailable, "transport is closing"), "Reconnect", false, 6 * initial},
		{"error", status.Error(codes.Internal, "boom"), "Error", true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *xds.Config) { c.Backoff = xds.Backoff{Initial: initial, Jitter: -1} })
			h.start()
			h.waitReady()
			var gaps []time.Duration
			for i := range 4 {
				start := time.Now()
				h.srv.CloseStreams(tt.err)
				waitFor(t, "reconnect", func() bool { return h.srv.Connections() == i+2 })
				gaps = append(gaps, time.Since(start))
			}
			if got := h.counter("istio_xds_connection_terminations_total", tt.reason); got != 4 {
				t.Errorf("terminations{reason=%q} = %v, want 4", tt.reason, got)
			}
			last := gaps[len(gaps)-1]
			if tt.growing {
				// Delays 50, 100, 200, 400ms.
				if last < 8*initial || last < gaps[0]+5*initial {
					t.Errorf("gaps after errors = %v; want the 4th ≥ %v", gaps, 8*initial)
				}
			} else if last > tt.maxLastGap {
				t.Errorf("gaps = %v; want each ≤ %v", gaps, tt.maxLastGap)
			}
		})
	}
}

func TestRunTwice(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.waitReady()
	if err := h.client.Run(context.Background()); err == nil {
		t.Error("second concurrent Run = nil, want error")
	}
}
