package gozt_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gozt/gozt"

// allowed lists, per package (module-relative), the module packages it may
// import directly (DESIGN.md, "Import rules"). A package missing from this
// table fails the test, so a new package must state its place.
var allowed = map[string][]string{
	"certs/identity":                {},
	"rbac":                          {"certs/identity"},
	"certs":                         {"certs/identity"},
	"certs/istioca":                 {"certs", "certs/identity", "istiod"},
	"certs/localca":                 {"certs", "certs/identity"},
	"certs/istioca/istiocatest":     {"certs", "certs/identity", "certs/localca", "certs/istioca"},
	"certs/certstest":               {},
	"state":                         {"rbac", "certs/identity", "internal/hashindex"},
	"xds":                           {"state", "rbac", "certs/identity", "istiod", "internal/hashindex"},
	"xds/xdsserver":                 {"xds"},
	"xds/xdstest":                   {"xds", "xds/xdsserver"},
	"hbone":                         {"certs", "certs/identity", "internal/workers"},
	"hbone/hbonetest":               {},
	"proxy/relay":                   {"internal/workers", "proxy/sockwait"},
	"proxy/netns":                   {},
	"proxy/sockwait":                {},
	"proxy/sockopt":                 {"proxy/netns"},
	"proxy/connmgr":                 {"rbac", "state", "certs/identity"},
	"proxy/admission":               {},
	"proxy/telemetry":               {"state", "rbac", "certs/identity"},
	"proxy/telemetry/telemetrytest": {"state"},
	"proxy/dns":                     {"state", "certs/identity", "proxy/sockopt", "proxy/netns", "proxy/admission", "proxy/sockwait"},
	"proxy/inpod":                   {"proxy/netns"},
	"proxy/inpod/inpodtest":         {"proxy/inpod"},
	"deploy":                        {},
	"deploy/image":                  {},
	"proxy": {"state", "proxy/relay", "proxy/sockopt", "proxy/netns", "proxy/connmgr", "proxy/dns",
		"proxy/inpod", "proxy/admission", "proxy/telemetry", "proxy/sockwait", "hbone", "rbac", "certs", "certs/identity",
		"internal/workers"},
	"bench": {"proxy", "state", "proxy/relay", "proxy/sockopt", "proxy/netns", "proxy/inpod", "proxy/telemetry", "hbone", "rbac",
		"certs", "certs/identity", "certs/localca", "xds", "xds/xdsserver", "internal/runner",
		"proxy/inpod/inpodtest", "certs/istioca/istiocatest", "internal/envconfig"},
	"tools":              {},
	"istiod":             {},
	"internal/nstest":    {"proxy/netns"},
	"internal/runner":    {},
	"internal/jsonshape": {},
	"internal/tcptest":   {},
	"internal/proctest":  {},
	"internal/syncbuf":   {},
	"internal/dnstest":   {},
	"internal/workers":   {},
	"internal/gctest":    {},
	"internal/hashindex": {},
	"internal/envconfig": {"proxy", "proxy/admission", "proxy/telemetry", "proxy/connmgr", "proxy/dns", "proxy/netns",
		"proxy/sockopt", "proxy/sockwait", "state", "hbone", "certs"},
}

// stdlibOnly packages may import nothing outside the standard library, except
// the listed third-party paths.
var stdlibOnly = map[string][]string{
	"certs/identity":  {"github.com/spiffe/go-spiffe/v2/spiffeid"},
	"istiod":          nil,
	"internal/nstest": {"golang.org/x/sys/unix"},
	"rbac":            nil,
	"proxy/relay":     {"golang.org/x/sys/unix"},
	"proxy/sockopt":   {"golang.org/x/sys/unix"},
	"proxy/netns":     {"golang.org/x/sys/unix"},
	"proxy/sockwait":  {"golang.org/x/sys/unix"},
	"proxy/admission": nil,
}

type listedPackage struct {
	ImportPath string
	Imports    []string
}

func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		checkPackage(t, p)
	}
}

func checkPackage(t *testing.T, p listedPackage) {
	t.Helper()
	rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
	if rel == "" {
		return
	}
	inCmd := rel == "cmd" || strings.HasPrefix(rel, "cmd/")
	allow, known := allowed[rel]
	if !known && !inCmd {
		t.Errorf("package %s is not in the import-rule table of deps_test.go", rel)
		return
	}
	for _, imp := range p.Imports {
		if !strings.HasPrefix(imp, module+"/") {
			if extra, ok := stdlibOnly[rel]; ok && isThirdParty(imp) && !contains(extra, imp) {
				t.Errorf("%s imports %s; it may use only the standard library", rel, imp)
			}
			continue
		}
		target := strings.TrimPrefix(imp, module+"/")
		if target == "cmd" || strings.HasPrefix(target, "cmd/") {
			if !inCmd {
				t.Errorf("%s imports %s; nothing outside cmd may import cmd", rel, target)
			}
			continue
		}
		if !inCmd && !contains(allow, target) {
			t.Errorf("%s imports %s; DESIGN.md allows only %v", rel, target, allow)
		}
	}
}

func isThirdParty(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return strings.Contains(first, ".")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// binaryBadDeps are packages the gozt binary must never link, with the
// reason. Test helpers (xds/xdstest, certs/istioca/istiocatest,
// certs/certstest, hbone/hbonetest, internal/tcptest, internal/proctest,
// internal/dnstest, internal/gctest)
// import testing; internal/syncbuf imports no testing, so only its entry
// here keeps it out; bench uses xds/xdsserver, the core under xdstest that
// does not. The harness and its fake istiod are a binary of their own,
// cmd/gozt-bench, so neither ships in the node image (issue 38).
var binaryBadDeps = map[string]string{
	module + "/bench":                         "the benchmark harness; it is cmd/gozt-bench's",
	module + "/xds/xdsserver":                 "the fake istiod the harness runs; it is cmd/gozt-bench's",
	"testing":                                 "test code in the binary",
	"github.com/google/go-cmp/cmp":            "a test dependency",
	"go.uber.org/goleak":                      "a test dependency",
	module + "/xds/xdstest":                   "a test helper; use xds/xdsserver",
	module + "/certs/istioca/istiocatest":     "a test helper",
	module + "/internal/tcptest":              "a test helper",
	module + "/internal/proctest":             "a test helper",
	module + "/internal/syncbuf":              "a test helper",
	module + "/internal/dnstest":              "a test helper",
	module + "/hbone/hbonetest":               "a test helper",
	module + "/certs/certstest":               "a test helper",
	module + "/internal/nstest":               "a test helper",
	module + "/proxy/telemetry/telemetrytest": "a test helper",
	module + "/internal/jsonshape":            "a test helper",
	module + "/internal/gctest":               "a test helper",
}

// TestBinaryDeps checks that cmd/gozt's dependencies never include testing
// or a test helper (as tailscale's cmd/tailscaled/deps_test.go does).
func TestBinaryDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./cmd/gozt").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps ./cmd/gozt: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps ./cmd/gozt: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		why, bad := binaryBadDeps[pkg]
		if !bad && strings.HasPrefix(pkg, "testing/") {
			why, bad = binaryBadDeps["testing"], true
		}
		if bad {
			t.Errorf("cmd/gozt depends on %s: %s", pkg, why)
		}
	}
}
