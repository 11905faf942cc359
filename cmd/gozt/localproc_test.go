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

// proc is one process the test started, its output kept as it writes,
// killed at the test's end if still running.
type proc struct {
	cmd            *exec.Cmd
	exited         chan error // receives Wait's result once; put it back after reading
	stdout, stderr syncbuf.Buffer
}

// startProc starts args[0] with the rest of args and env added to the
// test's environment.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(args[0], args[1:]...), exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
		}
	})
	return p
}

// stop sends SIGTERM and fails t unless the process exits with status 0
// within 15 s.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			t.Errorf("gozt exited with %v after SIGTERM, want status 0\nstderr:\n%s", err, &p.stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("gozt did not exit within 15s of SIGTERM\nstderr:\n%s", &p.stderr)
	}
}

// localProc is one `gozt local` process of the binary built for the test,
// on a config of the test's own.
type localProc struct {
	*proc
	caDir string
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
	caDir := filepath.Join(dir, "ca")
	args := append(append([]string(nil), wrap...), bin, "local", "--config", cfg, "--ca-dir", caDir,
		"--admin-addr", sideIP+":15000", "--metrics-addr", sideIP+":15020", "--readiness-addr", sideIP+":15021")
	p := &localProc{proc: startProc(t, env, args...), caDir: caDir}
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
