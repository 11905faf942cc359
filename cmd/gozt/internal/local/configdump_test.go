package local

import (
	"encoding/json"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/internal/jsonshape"
	"github.com/gozt/gozt/proxy/telemetry"
)

// TestConfigDumpShape pins every key path of /config_dump, with its JSON
// type, against testdata/configdump-local.golden: the names, casing and
// nesting istioctl ztunnel-config and gozt explain read. Values are left
// out, so a golden change always means a shape change.
// GOZT_UPDATE_GOLDEN=1 rewrites the file.
func TestConfigDumpShape(t *testing.T) {
	tm := startMeshWith(t, `
policies:
- name: allow-client
  namespace: demo
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [{Exact: cluster.local/ns/demo/sa/client}]
    - - destinationPorts: [8080]
`)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	c := tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	c.Close()
	// One connection stays open, so that workloadState's lists have the
	// same shape whether or not the closed one is gone yet.
	live := tm.socksDial(t, tm.ips.Server+":8080")
	defer live.Close()
	roundTrip(t, live)

	body := httpGet(t, "http://"+tm.AdminAddr().String()+"/config_dump")
	jsonshape.Check(t, []byte(body), filepath.Join("testdata", "configdump-local.golden"), dumpDataKeyed...)
	// Never a private key or a token, in any section.
	for _, secret := range []string{"PRIVATE KEY", "privateKey", "private_key", "\"key\":", "token", "Token"} {
		if strings.Contains(body, secret) {
			t.Errorf("config_dump contains %q", secret)
		}
	}
}

// dumpDataKeyed are the /config_dump objects keyed by data (names,
// addresses, ports) rather than by field names.
var dumpDataKeyed = []string{".stagedServices", ".stagedServices.{}", ".services[].ports", ".services[].vips",
	".workloads[].services", ".workloads[].services.{}", ".services[].endpoints", ".services[].endpoints.{}.port",
	".staticConfig.workloads[].services", ".workloadState"}

// TestConfigDumpWorkloadState: gozt local's /config_dump has workloadState,
// in shared mode's shape, with one entry per workload it proxies (keyed
// by uid), each Up with its live connections: the client's outbound HBONE
// connection to the server, and the server's inbound one from the client.
func TestConfigDumpWorkloadState(t *testing.T) {
	tm := startMesh(t)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	// The client app dials from the client's IP, as from its pod.
	app := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tm.ips.Client)}}
	d, _ := xproxy.SOCKS5("tcp", net.JoinHostPort(tm.ips.Client, "15080"), nil, app)
	live, err := d.Dial("tcp", tm.ips.Server+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	roundTrip(t, live)

	var dump struct {
		WorkloadState map[string]struct {
			State       string
			Connections struct{ Inbound, Outbound []telemetry.ConnJSON }
			Info        struct{ Name, Namespace, TrustDomain, ServiceAccount string }
		} `json:"workloadState"`
	}
	body := httpGet(t, "http://"+tm.AdminAddr().String()+"/config_dump")
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{ // uid → service account
		"Kubernetes//Pod/demo/client": "client", "Kubernetes//Pod/demo/server": "server", "Kubernetes//Pod/demo/server2": "server",
	}
	if len(dump.WorkloadState) != len(want) {
		t.Errorf("workloadState has %d entries, want one per proxied workload: %v", len(dump.WorkloadState), slices.Collect(maps.Keys(want)))
	}
	for uid, sa := range want {
		ws, ok := dump.WorkloadState[uid]
		name := uid[strings.LastIndexByte(uid, '/')+1:]
		if !ok || ws.State != "Up" || ws.Info.Name != name || ws.Info.Namespace != "demo" || ws.Info.ServiceAccount != sa || ws.Info.TrustDomain != "cluster.local" {
			t.Errorf("workloadState[%s] = %+v (present %v), want Up, demo/%s, service account %s in cluster.local", uid, ws, ok, name, sa)
		}
	}
	if out := dump.WorkloadState["Kubernetes//Pod/demo/client"].Connections.Outbound; len(out) != 1 ||
		out[0].OriginalDst != tm.ips.Server+":8080" || out[0].Protocol != "HBONE" || !strings.HasPrefix(out[0].Src, tm.ips.Client+":") {
		t.Errorf("client's outbound connections = %+v, want one HBONE from %s to %s:8080", out, tm.ips.Client, tm.ips.Server)
	}
	if in := dump.WorkloadState["Kubernetes//Pod/demo/server"].Connections.Inbound; len(in) != 1 || !strings.HasPrefix(in[0].Src, tm.ips.Client+":") {
		t.Errorf("server's inbound connections = %+v, want one from %s", in, tm.ips.Client)
	}
	if in := dump.WorkloadState["Kubernetes//Pod/demo/server2"].Connections; len(in.Inbound)+len(in.Outbound) != 0 {
		t.Errorf("server2's connections = %+v, want none", in)
	}
}
