package local

import (
	"bytes"
	"strings"
	"testing"

	ztunneldump "istio.io/istio/istioctl/pkg/writer/ztunnel/configdump"
)

// TestIstioctlReadsConfigDump feeds our /config_dump to istioctl's own
// ztunnel-config reader (istio.io/istio/istioctl/pkg/writer/ztunnel/configdump)
// and checks the tables `istioctl ztunnel-config workloads|services|policies|certificates|connections`
// would print, the last with a connection open.
func TestIstioctlReadsConfigDump(t *testing.T) {
	tm := startMeshWith(t, `
policies:
- name: allow-all
  namespace: demo
  scope: Namespace
  action: Allow
  rules:
  - - - namespaces: [{Prefix: de}]
`)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	c := tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	c.Close()
	live := tm.socksDial(t, tm.ips.Server+":8080") // open while the dump is taken
	defer live.Close()
	roundTrip(t, live)

	dump := httpGet(t, "http://"+tm.AdminAddr().String()+"/config_dump")
	var out bytes.Buffer
	cw := &ztunneldump.ConfigWriter{Stdout: &out}
	if err := cw.Prime([]byte(dump)); err != nil {
		t.Fatalf("istioctl cannot read our config_dump: %v", err)
	}
	for name, tc := range map[string]struct {
		print func() error
		want  []string
	}{
		"workloads": {func() error { return cw.PrintWorkloadSummary(ztunneldump.WorkloadFilter{}) },
			[]string{"demo", "client", tm.ips.Client, "HBONE", "server2", tm.ips.Server2}},
		"services": {func() error { return cw.PrintServiceSummary(ztunneldump.ServiceFilter{}) },
			[]string{"demo", "echo", tm.vip, "2/2"}},
		"policies": {func() error { return cw.PrintPolicySummary(ztunneldump.PolicyFilter{}) },
			[]string{"demo", "allow-all"}},
		"certificates": {func() error { return cw.PrintSecretSummary() },
			[]string{"spiffe://cluster.local/ns/demo/sa/client", "Leaf", "Available", "true", "Root"}},
		"connections": {func() error { return cw.PrintConnectionsSummary(ztunneldump.ConnectionsFilter{}) },
			[]string{"client.demo", "Outbound", "server.demo:15008", "server.demo:8080", "HBONE", "server.demo", "Inbound"}},
	} {
		out.Reset()
		if err := tc.print(); err != nil {
			t.Errorf("istioctl %s: %v", name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("istioctl ztunnel-config %s output lacks %q:\n%s", name, w, out.String())
			}
		}
	}
	out.Reset()
	if err := cw.PrintPolicyDump(ztunneldump.PolicyFilter{}, "json"); err != nil || !strings.Contains(out.String(), `"Prefix": "de"`) {
		t.Errorf("istioctl policy dump = %v:\n%s", err, out.String())
	}
}
