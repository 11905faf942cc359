package local

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gozt/gozt/internal/jsonshape"
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
	".staticConfig.workloads[].services"}
