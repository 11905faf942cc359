package local

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
	var dump any
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatalf("config_dump is not JSON: %v", err)
	}
	got := strings.Join(keyPaths(dump), "\n") + "\n"
	golden := filepath.Join("testdata", "configdump-local.golden")
	if os.Getenv("GOZT_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (GOZT_UPDATE_GOLDEN=1 writes it)", err)
	}
	if got != string(want) {
		t.Errorf("/config_dump shape changed (GOZT_UPDATE_GOLDEN=1 rewrites %s):\n%s", golden, lineDiff(string(want), got))
	}
	// Never a private key or a token, in any section.
	for _, secret := range []string{"PRIVATE KEY", "privateKey", "private_key", "\"key\":", "token", "Token"} {
		if strings.Contains(body, secret) {
			t.Errorf("config_dump contains %q", secret)
		}
	}
}

// keyPaths lists "path type" for every value in v, arrays as [], sorted
// and without duplicates; maps keyed by data (names, addresses) are
// collapsed to {} so the list depends on the shape only.
func keyPaths(v any) []string {
	set := map[string]bool{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			set[path+" object"] = true
			for k, e := range x {
				if dataKeyed(path) {
					k = "{}"
				}
				walk(path+"."+k, e)
			}
		case []any:
			set[path+" array"] = true
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			set[path+" string"] = true
		case float64:
			set[path+" number"] = true
		case bool:
			set[path+" bool"] = true
		case nil:
			set[path+" null"] = true
		default:
			panic(fmt.Sprintf("%T", v))
		}
	}
	walk("", v)
	return slices.Sorted(func(yield func(string) bool) {
		for k := range set {
			if !yield(k) {
				return
			}
		}
	})
}

// dataKeyed reports whether the object at path is keyed by data rather
// than by field names.
func dataKeyed(path string) bool {
	for _, suffix := range []string{".stagedServices", ".stagedServices.{}", ".services[].ports", ".services[].vips",
		".workloads[].services", ".workloads[].services.{}", ".services[].endpoints", ".services[].endpoints.{}.port", ".staticConfig.workloads[].services"} {
		if strings.HasSuffix(path, suffix) {
			return true
		}
	}
	return false
}

// lineDiff shows the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
