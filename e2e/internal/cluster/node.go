package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nodeProc is one process of the node: containerd or the kubelet.
type nodeProc struct {
	Name string
	Bin  string
	Args []string
}

func nodeSpec() string { return filepath.Join(RunDir, "node.json") }

// startNode starts the node: `gozt-e2e node` as PID 1 of a new PID and
// mount namespace (in the host's network namespace), which runs procs.
//
// Why a PID namespace: on this machine the host's PID 1 (the sandbox's
// init) refuses access to its namespace files to every process, root
// included (stat /proc/1/ns/net: permission denied), and istio-cni's node
// agent identifies the host network namespace by /host/proc/1/ns/net, the
// node's /proc mounted into its pod. In the node's own PID namespace, with
// its own /proc, PID 1 is the node process, in the host's network
// namespace, as on a real node. kind runs its nodes the same way. The
// mount namespace also keeps the kubelet's and containerd's mounts off the
// host: they go when the node stops.
func (c *Config) startNode(procs []nodeProc) error {
	b, err := json.Marshal(procs)
	if err != nil {
		return err
	}
	if err := os.WriteFile(nodeSpec(), b, 0o644); err != nil {
		return err
	}
	self := c.bin("gozt-e2e")
	return c.startWith("node", self, []string{"node", "-repo", c.Repo}, nil, unix.CLONE_NEWPID|unix.CLONE_NEWNS)
}

// RunNode is the node's PID 1: it makes its mount namespace's root shared
// (istio-cni mounts /var/run/netns with HostToContainer propagation, which
// containerd refuses on a private mount; systemd makes / shared on a normal
// host), mounts a /proc of its own, starts the procs of nodeSpec in order,
// reaps every orphan, and on SIGTERM stops them; it returns when one of
// them exits. When it returns, the kernel kills whatever is left in the
// namespace.
func (c *Config) RunNode(ctx context.Context) error {
	if os.Getpid() != 1 {
		return fmt.Errorf("node: not PID 1 of its own namespace")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	b, err := os.ReadFile(nodeSpec())
	if err != nil {
		return err
	}
	var procs []nodeProc
	if err := json.Unmarshal(b, &procs); err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	main := map[int]string{}
	for _, p := range procs {
		pid, err := c.startNodeProc(p)
		if err != nil {
			return err
		}
		main[pid] = p.Name
		if p.Name == "containerd" {
			waitSocket(containerdSock(), 30*time.Second)
		}
	}
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			log.Printf("node: %v: stopping", sig)
			for pid := range main {
				syscall.Kill(pid, syscall.SIGTERM)
			}
			// Give them up to 5 s to exit, reaping as they go.
			for end := time.Now().Add(5 * time.Second); len(main) > 0 && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				for pid, ws := range reaped() {
					if name, ok := main[pid]; ok {
						log.Printf("node: %s exited: %v", name, ws)
						delete(main, pid)
					}
				}
			}
			return nil
		}
		for pid, ws := range reaped() {
			if name, ok := main[pid]; ok {
				return fmt.Errorf("node: %s exited: %v", name, ws)
			}
		}
	}
	return nil
}

// reaped collects every exited child without blocking and yields each
// one's pid and wait status.
func reaped() iter.Seq2[int, syscall.WaitStatus] {
	return func(yield func(int, syscall.WaitStatus) bool) {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil || !yield(pid, ws) {
				return
			}
		}
	}
}

func (c *Config) startNodeProc(p nodeProc) (int, error) {
	logf, err := os.OpenFile(filepath.Join(c.LogDir(), p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = StateDir
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", p.Name, err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // reaped by RunNode's loop
	return pid, nil
}

func waitSocket(path string, timeout time.Duration) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
}
