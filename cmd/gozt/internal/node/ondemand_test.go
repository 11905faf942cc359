package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/gozt/gozt/xds"
)

// TestOnDemandEndToEnd: two dedicated proxies with XDS_ON_DEMAND=true (and
// the DNS proxy off, which on-demand requires) on different nodes get only
// their own workloads from istiod. A connection from the client to the
// server's workload, which the client was never pushed, succeeds after the
// client demands "/<server IP>"; the server's inbound side demands the
// peer "/<client IP>". A destination istiod does not know is answered with
// a removal and the connection goes through in passthrough, as an unknown
// address does without on-demand.
func TestOnDemandEndToEnd(t *testing.T) {
	nextNet++
	clientIP := fmt.Sprintf("127.91.%d.2", nextNet)
	serverIP := fmt.Sprintf("127.91.%d.3", nextNet)
	unknownIP := fmt.Sprintf("127.91.%d.9", nextNet)
	cp := newControlPlane(t)
	cw, sw := workload("client", clientIP), workload("server", serverIP)
	cw.Node, sw.Node = "node-c", "node-s"
	cp.xds.PushWorkload(cw, sw)
	env := []string{"XDS_ON_DEMAND=true", "ISTIO_META_DNS_CAPTURE=false"}
	client := cp.startNodeEnv(t, "client", clientIP, append(env, "NODE_NAME=node-c")...)
	cp.startNodeEnv(t, "server", serverIP, append(env, "NODE_NAME=node-s")...)
	sources := echo(t, serverIP+":8080")
	passthrough := echo(t, unknownIP+":8080")

	select {
	case <-client.xds.Ready():
	case <-t.Context().Done():
	}
	waitFor(t, func() bool { return client.store.Snapshot().WorkloadByUID(cw.Uid) != nil }, "the client's own workload")
	if client.store.Snapshot().WorkloadByUID(sw.Uid) != nil {
		t.Fatal("the server workload reached the client without a demand")
	}

	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Fatalf("connection to the demanded workload: %v", err)
	}
	if got := sources(); len(got) != 1 || !strings.HasPrefix(got[0], clientIP+":") {
		t.Errorf("backend saw %v, want one connection from %s", got, clientIP)
	}
	want := map[string]bool{"/" + serverIP: false, "/" + clientIP: false}
	cp.xds.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		if r.GetTypeUrl() == xds.AddressTypeURL && len(r.GetResourceNamesSubscribe()) == 1 {
			if _, ok := want[r.GetResourceNamesSubscribe()[0]]; ok {
				want[r.GetResourceNamesSubscribe()[0]] = true
			}
		}
		return !slices.Contains(mapValues(want), false)
	})
	if client.store.Snapshot().WorkloadByUID(sw.Uid) == nil {
		t.Error("the demanded server workload is not in the client's store")
	}

	if err := socksPing(clientIP, unknownIP+":8080"); err != nil {
		t.Fatalf("connection to an unknown address: %v", err)
	}
	if got := passthrough(); len(got) != 1 || !strings.HasPrefix(got[0], clientIP+":") {
		t.Errorf("unknown address saw %v, want one passthrough connection from %s", got, clientIP)
	}
	cp.xds.NextRequest(t, func(r *discoveryv3.DeltaDiscoveryRequest) bool {
		return slices.Equal(r.GetResourceNamesSubscribe(), []string{"/" + unknownIP})
	})
}

func mapValues(m map[string]bool) []bool {
	var out []bool
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
