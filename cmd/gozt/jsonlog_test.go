package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/syncbuf"
)

// TestJSONLogsOnly: with LOG_FORMAT=json (the chart's logAsJson) every line
// `gozt proxy` writes, on stdout and stderr, is a JSON object, so a log
// pipeline that parses each line loses none: the start-up banner of
// shared and dedicated mode, the records of a run that cannot reach its CA,
// the shutdown, and the error a failed start-up exits with. The proxies run
// in network namespaces of their own, where the fixed ports (15000, 15001,
// 15006, 15008, 15020, 15021, 15053) are free.
func TestJSONLogsOnly(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	bin := filepath.Join(t.TempDir(), "gozt")
	nstest.Run(t, "go", "build", "-o", bin, ".")
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	common := []string{
		"LOG_FORMAT=json", "RUST_LOG=debug", "IPV6_ENABLED=false",
		"XDS_ADDRESS=", "CA_ADDRESS=https://127.0.0.1:1", "CA_ROOT_CA=" + string(ca.RootPEM()),
		"CONNECTION_TERMINATION_DEADLINE=1s",
	}
	t.Run("shared", func(t *testing.T) {
		stdout, stderr := runProxyUntilBanner(t, bin, append(common,
			"PROXY_MODE=shared", "INPOD_UDS="+filepath.Join(t.TempDir(), "ztunnel.sock")))
		checkJSONLines(t, stdout, stderr, "shared")
	})
	t.Run("dedicated", func(t *testing.T) {
		stdout, stderr := runProxyUntilBanner(t, bin, append(common,
			"PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=demo/client/client"))
		checkJSONLines(t, stdout, stderr, "dedicated")
	})
	t.Run("start-up error", func(t *testing.T) {
		cmd := exec.Command(bin, "proxy")
		cmd.Env = append(os.Environ(), "LOG_FORMAT=json", "PROXY_MODE=dedicated",
			"PROXY_WORKLOAD_INFO=demo/client/client", "CA_ROOT_CA=not a certificate")
		var stdout, stderr syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err == nil {
			t.Fatal("gozt proxy with a bad CA_ROOT_CA exited 0, want 1")
		}
		checkJSONLines(t, stdout.String(), stderr.String(), "")
		if !strings.Contains(stderr.String(), "CA_ROOT_CA") {
			t.Errorf("stderr does not name CA_ROOT_CA:\n%s", stderr.String())
		}
	})
}

// runProxyUntilBanner runs `gozt proxy` with env added to the test's in a
// new network namespace until it has logged its start-up banner, then
// stops it with SIGTERM and returns what it wrote.
func runProxyUntilBanner(t *testing.T, bin string, env []string) (stdout, stderr string) {
	t.Helper()
	ns := nstest.NewNetns(t)
	p := startInNetns(t, ns, bin, env, "proxy")
	for start := time.Now(); !strings.Contains(p.stdout.String()+p.stderr.String(), "gozt proxy"); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no start-up banner within 20s\nstdout:\n%s\nstderr:\n%s", &p.stdout, &p.stderr)
		}
	}
	p.stop(t)
	return p.stdout.String(), p.stderr.String()
}

// checkJSONLines fails t for every line of stdout or stderr that is not a
// JSON object, and, unless mode is "", unless one of them is the start-up
// banner naming mode.
func checkJSONLines(t *testing.T, stdout, stderr, mode string) {
	t.Helper()
	banner := false
	lines := 0
	for name, text := range map[string]string{"stdout": stdout, "stderr": stderr} {
		for line := range strings.Lines(text) {
			lines++
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("%s line is not a JSON object (%v): %q", name, err, line)
				continue
			}
			if msg, _ := rec["message"].(string); strings.HasPrefix(msg, "gozt proxy") && rec["mode"] == mode {
				banner = true
			}
		}
	}
	if lines == 0 {
		t.Error("gozt wrote nothing")
	}
	if mode != "" && !banner {
		t.Errorf("no start-up banner record with mode %q\nstdout:\n%s\nstderr:\n%s", mode, stdout, stderr)
	}
}
