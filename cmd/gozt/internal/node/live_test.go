package node

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	xproxy "golang.org/x/net/proxy"
	"istio.io/istio/pkg/workloadapi/security"
)

// liveJSON is the part of /debug/live this test reads.
type liveJSON struct {
	Mode      string `json:"mode"`
	Workloads []struct {
		Name, Identity string
		Certificate    *struct{ State, ExpirationTime string }
	} `json:"workloads"`
	Connections struct {
		Listed bool `json:"listed"`
	} `json:"connections"`
	Denials struct {
		Recent []struct {
			Via, Policy, Workload, SrcIdentity string
			Rule                               int
			Dst                                netip.AddrPort
		} `json:"recent"`
	} `json:"denials"`
	ControlPlane map[string]struct{ State, Address, Since string } `json:"controlPlane"`
}

func getLive(t *testing.T, n *Node) liveJSON {
	t.Helper()
	body := get(t, "http://"+n.AdminAddr().String()+"/debug/live")
	var v liveJSON
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/debug/live: %v\n%s", err, body)
	}
	return v
}

// TestLiveViewDedicated: a dedicated gozt proxy's /debug/live shows its
// workload with its certificate, xDS and the CA connected to the fake
// istiod, no ZDS, its connections listed, and a live connection that a
// pushed DENY closed, with the deciding policy and rule.
func TestLiveViewDedicated(t *testing.T) {
	clientIP, serverIP := "127.82.201.2", "127.82.201.3"
	cp := newControlPlane(t)
	cp.startNode(t, "client", clientIP)
	server := cp.startNode(t, "server", serverIP)
	echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))

	d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	c, err := d.Dial("tcp", serverIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := ping(c); err != nil {
		t.Fatal(err)
	}
	cp.xds.PushPolicy(&security.Authorization{
		Name: "deny", Namespace: "demo", Scope: security.Scope_NAMESPACE, Action: security.Action_DENY,
		Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{
			DestinationPorts: []uint32{8080},
		}}}}}},
	})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection survived a DENY policy")
	}

	var v liveJSON
	deadline := time.Now().Add(5 * time.Second) // the close is recorded as the relay ends
	for v = getLive(t, server); len(v.Denials.Recent) == 0 && time.Now().Before(deadline); v = getLive(t, server) {
		time.Sleep(10 * time.Millisecond)
	}
	// Dedicated mode lists its connections, for /config_dump's
	// workloadState, so the live view shows them too.
	if v.Mode != "dedicated" || !v.Connections.Listed {
		t.Errorf("mode %q, connections listed %v; want dedicated, listed", v.Mode, v.Connections.Listed)
	}
	if len(v.Workloads) != 1 || v.Workloads[0].Name != "server" || v.Workloads[0].Identity != "spiffe://cluster.local/ns/demo/sa/server" ||
		v.Workloads[0].Certificate == nil || v.Workloads[0].Certificate.State != "Available" || v.Workloads[0].Certificate.ExpirationTime == "" {
		t.Errorf("workloads = %+v, want demo/server with an available certificate", v.Workloads)
	}
	xdsLink, caLink := v.ControlPlane["xds"], v.ControlPlane["ca"]
	if xdsLink.State != "connected" || !strings.Contains(xdsLink.Address, cp.xds.Addr()) || xdsLink.Since == "" {
		t.Errorf("xds link = %+v, want connected to %s", xdsLink, cp.xds.Addr())
	}
	if caLink.State != "connected" || !strings.Contains(caLink.Address, cp.cas.Addr()) {
		t.Errorf("ca link = %+v, want connected to %s", caLink, cp.cas.Addr())
	}
	if _, ok := v.ControlPlane["zds"]; ok {
		t.Error("dedicated mode shows a ZDS link")
	}
	if len(v.Denials.Recent) != 1 {
		t.Fatalf("denials = %+v, want the connection the DENY closed", v.Denials.Recent)
	}
	den := v.Denials.Recent[0]
	if den.Via != "policy change" || den.Policy != "demo/deny" || den.Rule != 0 || den.Workload != "demo/server" ||
		den.SrcIdentity != "spiffe://cluster.local/ns/demo/sa/client" || den.Dst.String() != serverIP+":8080" {
		t.Errorf("denial = %+v, want demo/deny rule 0 on a policy change, client → %s:8080", den, serverIP)
	}
}
