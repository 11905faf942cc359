package configdump

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/xds"
)

// localhostYAML is the SPEC §5.5 example that xds's tests parse.
var localhostYAML = filepath.Join("..", "..", "..", "..", "xds", "testdata", "localhost.yaml")

// TestLocalhostExample round-trips the SPEC §5.5 example through the config
// dump: FromSnapshot → Parse → Apply reproduces the same dump.
func TestLocalhostExample(t *testing.T) {
	cfg, err := xds.LoadLocalConfig(localhostYAML)
	if err != nil {
		t.Fatal(err)
	}
	snap := newStore(t, cfg.Apply).Snapshot()
	dump, err := json.Marshal(FromSnapshot(snap))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(dump)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(FromSnapshot(newStore(t, d.Apply).Snapshot()))
	if diff := cmp.Diff(string(dump), string(again)); diff != "" {
		t.Errorf("dump round trip (-first +second):\n%s", diff)
	}
}

// FuzzLocalConfig renders every local config the store accepts (xds's
// FuzzParseLocalConfig checks the parsing and applying).
func FuzzLocalConfig(f *testing.F) {
	if data, err := os.ReadFile(localhostYAML); err == nil {
		f.Add(data)
	}
	f.Add([]byte("workloads:\n- {name: a, namespace: ns, workloadIps: [10.0.0.1], services: {ns/s: {80: 8080}}}\nservices:\n- {namespace: ns, hostname: s, vips: [/10.0.0.1], cidrVips: [/10.0.0.0/8]}\n"))
	f.Add([]byte("policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{principals: [{Presence: []}], sourceIps: [::ffff:1.2.3.4/120]}]]]}\n"))
	f.Add([]byte("a: &a [1]\nb: *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := xds.ParseLocalConfig("fuzz.yaml", data)
		if err != nil {
			return
		}
		_ = FromSnapshot(newStore(t, cfg.Apply).Snapshot())
	})
}
