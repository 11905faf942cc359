package xdsserver

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/xds"
)

// TestOnDemandAnswers: a stream that subscribes to nothing ("*" in and
// out) gets only its node's workloads; a named subscription is answered
// with the resource named by uid and aliased "network/IP", or with a
// removal for an unknown name; a repeated subscription gets no answer;
// later pushes reach the stream only for what it subscribed; a wildcard
// stream still gets everything (istiod's generateDeltasOndemand and
// deltaWatchedResources).
func TestOnDemandAnswers(t *testing.T) {
	s := newTestServer(t, nil)
	local := &workloadapi.Workload{Uid: "local", Name: "local", Namespace: "ns", Node: "node-a", Addresses: [][]byte{{10, 0, 0, 1}}}
	remote := &workloadapi.Workload{Uid: "remote", Name: "remote", Namespace: "ns", Network: "net1", Addresses: [][]byte{{10, 0, 0, 2}}}
	s.PushWorkload(local, remote)

	c := dial(t, s, nil, nil)
	node := &corev3.Node{Id: "n", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NODE_NAME": structpb.NewStringValue("node-a")}}}
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, Node: node, ResourceNamesSubscribe: []string{"*"}, ResourceNamesUnsubscribe: []string{"*"}})
	if got := names(c.recv().GetResources()); !slices.Equal(got, []string{"local"}) {
		t.Errorf("initial on-demand answer = %v, want only the node's workload", got)
	}

	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, ResourceNamesSubscribe: []string{"net1/10.0.0.2"}})
	resp := c.recv()
	if got := names(resp.GetResources()); !slices.Equal(got, []string{"remote"}) || len(resp.GetRemovedResources()) != 0 {
		t.Fatalf("answer to net1/10.0.0.2 = %v removed %v, want [remote]", got, resp.GetRemovedResources())
	}
	if a := resp.GetResources()[0].GetAliases(); !slices.Equal(a, []string{"net1/10.0.0.2"}) {
		t.Errorf("aliases = %v, want [net1/10.0.0.2]", a)
	}

	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, ResourceNamesSubscribe: []string{"/10.9.9.9"}})
	resp = c.recv()
	if len(resp.GetResources()) != 0 || !slices.Equal(resp.GetRemovedResources(), []string{"/10.9.9.9"}) {
		t.Errorf("answer to an unknown name = %v removed %v, want only its removal", names(resp.GetResources()), resp.GetRemovedResources())
	}

	// Subscribed already: no answer. The next response is the push of
	// the subscribed workload; an unrelated one is not sent.
	c.send(&deltaRequest{TypeUrl: xds.AddressTypeURL, ResourceNamesSubscribe: []string{"/10.9.9.9"}})
	s.PushWorkload(&workloadapi.Workload{Uid: "other", Name: "other", Namespace: "ns", Addresses: [][]byte{{10, 0, 0, 3}}})
	remote.Name = "remote2"
	s.PushWorkload(remote)
	if got := names(c.recv().GetResources()); !slices.Equal(got, []string{"remote"}) {
		t.Errorf("next response = %v, want the push of remote only", got)
	}

	w := dial(t, s, nil, nil)
	w.send(&deltaRequest{TypeUrl: xds.AddressTypeURL})
	if got := names(w.recv().GetResources()); !slices.Equal(got, []string{"local", "other", "remote"}) {
		t.Errorf("wildcard initial answer = %v, want every workload", got)
	}
}
