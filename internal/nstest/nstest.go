// Package nstest helps the namespaced (tier-3) tests: one rule for when
// they run, skip or fail, and the network-namespace facts they check. Only
// tests import it.
package nstest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
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

// Run runs a command and returns its combined output, failing t with that
// output if it fails.
func Run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// NewNetns creates a network namespace with loopback up and returns its
// name (its file is /run/netns/NAME). It is deleted at cleanup, with the
// veth ends in it, whether the test passed or not.
func NewNetns(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "gozt-" + hex.EncodeToString(b)
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", name, err, out)
		}
	})
	Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}
