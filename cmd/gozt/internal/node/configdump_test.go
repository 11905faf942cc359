package node

import (
	"path/filepath"
	"strings"
	"testing"

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
	var body string
	waitFor(t, func() bool {
		body = get(t, "http://"+client.AdminAddr().String()+"/config_dump")
		return strings.Contains(body, `"certChain"`)
	}, "the client's certificate in /config_dump")
	jsonshape.Check(t, []byte(body), filepath.Join("testdata", "configdump-dedicated.golden"),
		".stagedServices", ".workloads[].services", ".config.caHeaders", ".config.proxyMetadata")
	for _, secret := range []string{"PRIVATE KEY", "test-token", "authToken\": \"t"} {
		if strings.Contains(body, secret) {
			t.Errorf("config_dump contains %q", secret)
		}
	}
}
