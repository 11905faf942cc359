package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/syncbuf"
)

// localProc is one `gozt local` process of the binary built for the test,
// on a config of the test's own, killed at the test's end.
type localProc struct {
	cmd            *exec.Cmd
	exited         chan error // receives Wait's result once; put it back after reading
	stdout, stderr syncbuf.Buffer
	caDir          string
}

// startLocal builds the binary and runs `gozt local` on config, with its
// side ports on sideIP (15000, 15020, 15021), env added to the test's, and
// the command line prefixed by wrap (e.g. prlimit and its flags, which
// exec gozt in place), then waits until it is ready.
func startLocal(t *testing.T, config, sideIP string, env []string, wrap ...string) *localProc {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "gozt")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfg := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &localProc{exited: make(chan error, 1), caDir: filepath.Join(dir, "ca")}
	args := append(append([]string(nil), wrap...), bin, "local", "--config", cfg, "--ca-dir", p.caDir,
		"--admin-addr", sideIP+":15000", "--metrics-addr", sideIP+":15020", "--readiness-addr", sideIP+":15021")
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	ready := "http://" + sideIP + ":15021/healthz/ready"
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("gozt never became ready\nstderr:\n%s", &p.stderr)
		}
	}
}
