package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
)

// This file is the tier-3 harness of shared mode: nodes and pods as network
// namespaces on this machine, linked by veths and bridges, with the redirect
// rules istio-cni installs inside each captured pod. Nothing leaves the
// machine: every address is in 10.250.0.0/16 (node underlay) or
// 10.251.0.0/16 (pods), and each lives only inside the test's namespaces.
//
//	node N netns: bridge br0 10.251.N.1/24, underlay veth 10.250.0.N/24
//	pod netns:    eth0 10.251.N.K/24 (on node N's br0), default via 10.251.N.1
//
// The gozt under test runs in the test process; its pod sockets are created
// inside the pod namespaces, which is what makes the traffic real.

var meshSeq atomic.Int32

// meshNet is one test's set of namespaces; every one is deleted at cleanup,
// whether the test passed or not.
type meshNet struct {
	t      *testing.T
	prefix string // short unique prefix for netns and link names
}

func newMeshNet(t *testing.T) *meshNet {
	t.Helper()
	nstest.RequireRoot(t, "ip", "iptables-restore")
	return &meshNet{t: t, prefix: fmt.Sprintf("gz%d%d", os.Getpid()%1000, meshSeq.Add(1))}
}

// netns creates a network namespace with loopback up.
func (m *meshNet) netns(name string) string {
	m.t.Helper()
	full := m.prefix + name
	nstest.Run(m.t, "ip", "netns", "add", full)
	m.t.Cleanup(func() { exec.Command("ip", "netns", "del", full).Run() })
	nstest.Run(m.t, "ip", "-n", full, "link", "set", "lo", "up")
	return full
}

// node creates node n's namespace (a router for its pods) and links it to
// the other nodes over the underlay.
func (m *meshNet) node(n int) string {
	m.t.Helper()
	ns := m.netns(fmt.Sprintf("n%d", n))
	nstest.Run(m.t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	nstest.Run(m.t, "ip", "-n", ns, "link", "add", "br0", "type", "bridge")
	nstest.Run(m.t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("10.251.%d.1/24", n), "dev", "br0")
	nstest.Run(m.t, "ip", "-n", ns, "link", "set", "br0", "up")
	for other := 1; other < n; other++ {
		peer := m.prefix + fmt.Sprintf("n%d", other)
		a, b := fmt.Sprintf("u%d", n), fmt.Sprintf("u%d", other)
		nstest.Run(m.t, "ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", peer)
		nstest.Run(m.t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("10.250.%d.%d/24", other, n), "dev", a)
		nstest.Run(m.t, "ip", "-n", peer, "addr", "add", fmt.Sprintf("10.250.%d.%d/24", other, other), "dev", b)
		nstest.Run(m.t, "ip", "-n", ns, "link", "set", a, "up")
		nstest.Run(m.t, "ip", "-n", peer, "link", "set", b, "up")
		nstest.Run(m.t, "ip", "-n", ns, "route", "add", fmt.Sprintf("10.251.%d.0/24", other), "via", fmt.Sprintf("10.250.%d.%d", other, other))
		nstest.Run(m.t, "ip", "-n", peer, "route", "add", fmt.Sprintf("10.251.%d.0/24", n), "via", fmt.Sprintf("10.250.%d.%d", other, n))
	}
	return ns
}

// pod is one pod's namespace and address.
type pod struct {
	name string // netns name
	ip   string
}

// path is the pod's netns file, whose fd istio-cni would send.
func (p pod) path() string { return "/run/netns/" + p.name }

// pod creates pod k on node n: a namespace on the node's bridge. captured
// installs istio-cni's in-pod redirect rules and its policy routing.
func (m *meshNet) pod(n, k int, captured bool) pod {
	m.t.Helper()
	node := m.prefix + fmt.Sprintf("n%d", n)
	ns := m.netns(fmt.Sprintf("p%d%d", n, k))
	ip := fmt.Sprintf("10.251.%d.%d", n, k)
	veth := fmt.Sprintf("v%d%d", n, k)
	nstest.Run(m.t, "ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
	nstest.Run(m.t, "ip", "-n", node, "link", "set", veth, "master", "br0", "up")
	nstest.Run(m.t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
	nstest.Run(m.t, "ip", "-n", ns, "link", "set", "eth0", "up")
	nstest.Run(m.t, "ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.251.%d.1", n))
	if captured {
		m.capture(ns)
	}
	return pod{name: ns, ip: ip}
}

// capture installs in ns the IPv4 rules istio-cni's own rule builder
// produces for an ambient pod (its golden file, applied unchanged), and the
// policy routing that returns replies to gozt's source-preserving sockets:
// connmark 0x111 → table 100 → local (SPEC §1.3).
func (m *meshNet) capture(ns string) {
	m.t.Helper()
	rules := istioCNIRules(m.t)
	cmd := exec.Command("ip", "netns", "exec", ns, "iptables-restore")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		m.t.Fatalf("iptables-restore in %s: %v\n%s", ns, err, out)
	}
	nstest.Run(m.t, "ip", "-n", ns, "rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100")
	nstest.Run(m.t, "ip", "-n", ns, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
}

var (
	cniRulesOnce sync.Once
	cniRules     string
	cniRulesErr  error
)

// istioCNIRules reads istio-cni's IPv4 in-pod rule set from the istio.io/istio
// module (cni/pkg/iptables/testdata/default.golden: what
// AppendInpodRules(...).BuildV4Restore() prints, SPEC §1.3), so the test
// uses Istio's own rules rather than a re-typed copy.
func istioCNIRules(t *testing.T) string {
	t.Helper()
	cniRulesOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
		if err != nil {
			cniRulesErr = fmt.Errorf("go list istio.io/istio: %w", err)
			return
		}
		dir := strings.TrimSpace(string(out))
		b, err := os.ReadFile(filepath.Join(dir, "cni", "pkg", "iptables", "testdata", "default.golden"))
		if err != nil {
			cniRulesErr = err
			return
		}
		var keep []string
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(line, "tables-save") { // the golden file's headers
				continue
			}
			keep = append(keep, line)
		}
		cniRules = strings.Join(keep, "\n") + "\n"
	})
	if cniRulesErr != nil {
		t.Fatalf("istio-cni rules: %v", cniRulesErr)
	}
	return cniRules
}

// inPod runs fn on a thread inside p's namespace; sockets fn makes stay there.
func inPod(t *testing.T, p pod, fn func() error) {
	t.Helper()
	if err := nstest.InNetns(p.path(), fn); err != nil {
		t.Fatal(err)
	}
}

// dialFrom connects from inside pod p to addr.
func dialFrom(t *testing.T, p pod, addr string) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	err := nstest.InNetns(p.path(), func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err = d.Dial("tcp", addr)
		return err
	})
	return c, err
}

// app is an echo server inside a pod that records each client's address.
type app struct{ sources func() []string }

// startApp listens on port inside p and echoes every connection, half-close
// included.
func startApp(t *testing.T, p pod, port int) *app {
	t.Helper()
	var ln net.Listener
	inPod(t, p, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	return &app{sources: serveEcho(t, ln)}
}

// last returns the source IP of the app's latest connection.
func (a *app) last() string {
	s := a.sources()
	if len(s) == 0 {
		return ""
	}
	host, _, _ := net.SplitHostPort(s[len(s)-1])
	return host
}

// count returns how many connections the app accepted.
func (a *app) count() int { return len(a.sources()) }

// exchange sends size seeded random bytes on c, half-closes, and checks that
// the same bytes come back through the echo app, in full and in order.
func exchange(c net.Conn, seed uint64, size int) error {
	payload := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range payload {
		payload[i] = byte(r.Uint32())
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read back: %w (after %d bytes)", err, len(got))
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Errorf("echo differs: sent %d bytes, got %d", len(payload), len(got))
	}
	return nil
}

// eventually polls cond every 20 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s", d, what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// threadNetnsInode is the inode of the calling thread's network namespace;
// call it on a locked thread (or expect any thread's).
func threadNetnsInode() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0
	}
	return st.Ino
}

func netnsInodeOfThread(t *testing.T) uint64 {
	t.Helper()
	ino := threadNetnsInode()
	if ino == 0 {
		t.Fatal("cannot stat /proc/thread-self/ns/net")
	}
	return ino
}

// socketNetnsInode is the inode of the network namespace a listener belongs
// to, or 0.
func socketNetnsInode(l net.Listener) uint64 {
	ino, _ := nstest.SocketNetns(l.(*net.TCPListener))
	return ino
}
