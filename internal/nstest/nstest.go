// Package nstest helps the namespaced (tier-3) tests: one rule for when
// they run, skip or fail, and the network-namespace facts they check. Only
// tests import it.
package nstest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireRoot lets a namespaced test run only as root with the given tools
// on PATH. Without root it skips loudly, or fails when GOZT_REQUIRE_ROOT=1
// (CI), so a skip never passes for green; as root a missing tool is a
// failure naming it, since `make test-deps` installs every one.
func RequireRoot(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("GOZT_REQUIRE_ROOT") == "1" {
			t.Fatalf("FAILING ROOT-ONLY NAMESPACE TEST %s: not running as root and GOZT_REQUIRE_ROOT=1", t.Name())
		}
		t.Skipf("SKIPPING ROOT-ONLY NAMESPACE TEST %s: needs root (CI runs it with GOZT_REQUIRE_ROOT=1)", t.Name())
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("namespaced test %s needs %s (make test-deps installs it): %v", t.Name(), tool, err)
		}
	}
}
