package node

import (
	"bytes"
	"encoding/json"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	xproxy "golang.org/x/net/proxy"
	ztunneldump "istio.io/istio/istioctl/pkg/writer/ztunnel/configdump"

	"github.com/gozt/gozt/internal/jsonshape"
)

// TestConfigDumpShapeDedicated pins the shape of a dedicated `gozt proxy`'s
// /config_dump (every key path and JSON type, SPEC §8.2) against
// testdata/configdump-dedicated.golden, as the local test does for `gozt
// local`: workloads and certificates from istiod, staticConfig empty, the
// config section from the environment. GOZT_UPDATE_GOLDEN=1 rewrites it.
func TestConfigDumpShapeDedicated(t *testing.T) {
	clientIP, serverIP := "127.89.2.2", "127.89.2.3"
	cp := newControlPlane(t)
	client := cp.startNode(t, "client", clientIP)
	echo(t, serverIP+":8080")
	cp.startNode(t, "server", serverIP)
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Fatal(err)
	}
	// One connection stays open, so that workloadState's outbound list has
	// the same shape whether or not the closed one is gone yet.
	d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	openLive(t, d, serverIP+":8080")
	var body string
	waitFor(t, func() bool {
		body = get(t, "http://"+client.AdminAddr().String()+"/config_dump")
		return strings.Contains(body, `"certChain"`)
	}, "the client's certificate in /config_dump")
	jsonshape.Check(t, []byte(body), filepath.Join("testdata", "configdump-dedicated.golden"),
		".stagedServices", ".workloads[].services", ".config.caHeaders", ".config.proxyMetadata", ".workloadState")
	for _, secret := range []string{"PRIVATE KEY", "test-token", "authToken\": \"t"} {
		if strings.Contains(body, secret) {
			t.Errorf("config_dump contains %q", secret)
		}
	}
}

// dumpJSON is the part of /config_dump these tests read.
type dumpJSON struct {
	WorkloadState map[string]struct {
		State       string `json:"state"`
		Connections struct {
			Inbound  []connJSON `json:"inbound"`
			Outbound []connJSON `json:"outbound"`
		} `json:"connections"`
		Info struct {
			Name, Namespace, TrustDomain, ServiceAccount string
		} `json:"info"`
	} `json:"workloadState"`
}

type connJSON struct {
	Src, OriginalDst, ActualDst, Protocol string
}

// TestConfigDumpWorkloadStateDedicated: a dedicated gozt proxy's
// /config_dump has workloadState, as shared mode's has, with one entry
// for the workload it proxies (keyed by its uid), Up, and its live
// connections: the client's outbound HBONE connection to the server, and
// the server's inbound one from the client. istioctl's own reader prints
// them as `istioctl ztunnel-config connections` would.
func TestConfigDumpWorkloadStateDedicated(t *testing.T) {
	clientIP, serverIP := "127.89.3.2", "127.89.3.3"
	cp := newControlPlane(t)
	client := cp.startNode(t, "client", clientIP)
	echo(t, serverIP+":8080")
	server := cp.startNode(t, "server", serverIP)
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	// The client app dials from the client's IP, as from its pod.
	app := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}
	d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, app)
	openLive(t, d, serverIP+":8080")

	for _, tc := range []struct {
		n    *Node
		name string
	}{{client, "client"}, {server, "server"}} {
		dump := dumpAt(t, tc.n)
		uid := "Kubernetes//Pod/demo/" + tc.name
		ws, ok := dump.WorkloadState[uid]
		if len(dump.WorkloadState) != 1 || !ok {
			t.Errorf("%s: workloadState = %+v, want one entry, %s", tc.name, dump.WorkloadState, uid)
			continue
		}
		if ws.State != "Up" || ws.Info.Name != tc.name || ws.Info.Namespace != "demo" ||
			ws.Info.ServiceAccount != tc.name || ws.Info.TrustDomain != "cluster.local" {
			t.Errorf("%s: workloadState[%s] = %+v, want Up, demo/%s, service account %s in cluster.local", tc.name, uid, ws, tc.name, tc.name)
		}
	}
	if out := dumpAt(t, client).WorkloadState["Kubernetes//Pod/demo/client"].Connections.Outbound; len(out) != 1 ||
		out[0].OriginalDst != serverIP+":8080" || out[0].Protocol != "HBONE" || !strings.HasPrefix(out[0].Src, clientIP+":") {
		t.Errorf("client's outbound connections = %+v, want one HBONE from %s to %s:8080", out, clientIP, serverIP)
	}
	if in := dumpAt(t, server).WorkloadState["Kubernetes//Pod/demo/server"].Connections.Inbound; len(in) != 1 ||
		!strings.HasPrefix(in[0].Src, clientIP+":") || in[0].ActualDst != serverIP+":8080" {
		t.Errorf("server's inbound connections = %+v, want one from %s to %s:8080", in, clientIP, serverIP)
	}

	var out bytes.Buffer
	cw := &ztunneldump.ConfigWriter{Stdout: &out}
	if err := cw.Prime([]byte(get(t, "http://"+client.AdminAddr().String()+"/config_dump"))); err != nil {
		t.Fatalf("istioctl cannot read the config_dump: %v", err)
	}
	if err := cw.PrintConnectionsSummary(ztunneldump.ConnectionsFilter{}); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`client\.demo\s+Outbound\s+client\.demo:\d+\s+server\.demo:15008\s+server\.demo:8080\s+HBONE`).MatchString(out.String()) {
		t.Errorf("istioctl ztunnel-config connections on the client lacks its outbound connection:\n%s", out.String())
	}
}

// dumpAt reads the parts of n's /config_dump that dumpJSON holds.
func dumpAt(t *testing.T, n *Node) dumpJSON {
	t.Helper()
	var d dumpJSON
	body := get(t, "http://"+n.AdminAddr().String()+"/config_dump")
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("config_dump: %v", err)
	}
	return d
}
