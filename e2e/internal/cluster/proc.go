package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pidDir holds one file per started component: its pid and its binary.
func pidDir() string { return filepath.Join(RunDir, "pids") }

// start runs bin with args as a detached component named name: its own
// session, output to LogDir/name.log, its pid recorded, and placed in the
// cluster's cgroups so that Down finds whatever it spawns.
func (c *Config) start(name, bin string, args []string, env []string) error {
	return c.startWith(name, bin, args, env, 0)
}

// startWith is start with clone flags for the new process (new
// namespaces).
func (c *Config) startWith(name, bin string, args []string, env []string, cloneflags uintptr) error {
	if err := os.MkdirAll(pidDir(), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(c.LogDir(), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(c.LogDir(), name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = StateDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: cloneflags}
	fmt.Fprintf(logf, "# %s %s\n", bin, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	// Nothing waits for it here: Down stops it by its recorded pid.
	cmd.Process.Release()
	if err := joinCgroups(pid); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	rec := fmt.Sprintf("%d %s\n", pid, bin)
	return os.WriteFile(filepath.Join(pidDir(), name), []byte(rec), 0o644)
}

// running reports whether the component name is alive.
func running(name string) bool {
	pid, bin, err := readPid(name)
	return err == nil && pidIs(pid, bin)
}

func readPid(name string) (int, string, error) {
	b, err := os.ReadFile(filepath.Join(pidDir(), name))
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, "", fmt.Errorf("pid file %s: %q", name, b)
	}
	pid, err := strconv.Atoi(f[0])
	return pid, f[1], err
}

// pidIs reports whether pid is alive and runs bin (a pid file can outlive
// its process, and the pid can be reused).
func pidIs(pid int, bin string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil || isZombie(st) {
		return false
	}
	return strings.TrimSuffix(exe, " (deleted)") == bin
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// stop sends SIGTERM to the component name, waits up to grace for it to
// exit, then kills it, and removes its pid file.
func stop(name string, grace time.Duration) error {
	pid, bin, err := readPid(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer os.Remove(filepath.Join(pidDir(), name))
	if !pidIs(pid, bin) {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !pidIs(pid, bin) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50 && pidIs(pid, bin); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// run runs a short command and returns its combined output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// waitFor polls cond every interval until it reports done, returns an
// error, or timeout passes; what names the wait in the error.
func waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("wait for %s: %w (last: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
