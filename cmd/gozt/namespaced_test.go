package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/nstest"
)

// TestLocalDemoWithCapture runs the gozt binary's demo mesh in its own
// network namespace, where an iptables rule captures connections to the
// service VIP into the client workload's outbound port (15001), as
// istio-cni's rules capture a pod's traffic. curl to the VIP must reach the
// demo echo backend through HBONE with the client's IP preserved, and
// SIGTERM must drain and exit 0.
func TestLocalDemoWithCapture(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables", "curl")
	bin := filepath.Join(t.TempDir(), "gozt")
	nstest.Run(t, "go", "build", "-o", bin, ".")
	ns := nstest.NewNetns(t)
	nstest.Run(t, "ip", "netns", "exec", ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
		"-d", "127.10.0.1", "--dport", "80", "-j", "DNAT", "--to-destination", "127.0.0.2:15001")

	p := startInNetns(t, ns, bin, nil, "local")
	stdout, stderr := &p.stdout, &p.stderr

	curl := func(args ...string) (string, error) {
		full := append([]string{"netns", "exec", ns, "curl", "-sS", "--max-time", "5"}, args...)
		out, err := exec.Command("ip", full...).CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := curl("http://127.0.0.1:15021/healthz/ready")
		if err == nil && strings.HasPrefix(out, "ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gozt never became ready: %v %s\nstdout:\n%s\nstderr:\n%s", err, out, stdout, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}

	for name, args := range map[string][]string{
		"captured VIP":  {"http://127.10.0.1/"},
		"socks5 pod IP": {"--socks5", "127.0.0.2:15080", "http://127.0.0.3:8080/"},
		"socks5 VIP":    {"--socks5", "127.0.0.2:15080", "http://127.10.0.1:80/"},
	} {
		out, err := curl(args...)
		if err != nil || !strings.Contains(out, "you are 127.0.0.2:") {
			t.Errorf("%s: curl %v = %q, %v; want the echo to see source 127.0.0.2", name, args, out, err)
		}
	}
	metrics, _ := curl("http://127.0.0.1:15020/metrics")
	if !hasMetric(metrics, "istio_tcp_connections_closed_total", `reporter="destination"`, `source_workload="client"`) {
		t.Errorf("metrics do not show the connections:\n%s", metrics)
	}

	p.stop(t)
	if !strings.Contains(stdout.String(), "curl --socks5 127.0.0.2:15080 http://127.0.0.3:8080/") {
		t.Errorf("start-up banner lacks the curl command:\n%s", stdout)
	}
	if !strings.Contains(stderr.String(), "connection complete") {
		t.Errorf("no access-log line in the logs:\n%s", stderr)
	}
}

// hasMetric reports whether a sample of name carries every one of labels.
func hasMetric(metrics, name string, labels ...string) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			return true
		}
	}
	return false
}

// startInNetns starts bin with args in network namespace ns, with env
// added to the test's environment.
func startInNetns(t *testing.T, ns, bin string, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, append([]string{"ip", "netns", "exec", ns, bin}, args...)...)
}
