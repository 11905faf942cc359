package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// debPackages are what the cluster needs from Debian: the runtime, the CNI
// plugins, and the tools kube-proxy, the kubelet and teardown run (ipset
// removes the sets istio-cni's node agent makes in the host's network
// namespace), and Prometheus, which scenario 10 runs on the node as Istio's
// addon would in the cluster.
var debPackages = []string{"containerd", "runc", "containernetworking-plugins", "iptables", "ipset", "conntrack", "iproute2", "mount", "prometheus"}

// debianCNIDir is where Debian's containernetworking-plugins installs.
const debianCNIDir = "/usr/lib/cni"

// installPackages installs what is missing with apt-get; it does nothing
// when everything is there.
func installPackages(ctx context.Context) error {
	var missing []string
	for _, p := range debPackages {
		out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !strings.Contains(string(out), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	fmt.Fprintf(os.Stderr, "e2e: apt-get install %s\n", strings.Join(missing, " "))
	if err := run(ctx, "apt-get", "update", "-qq"); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %v: %w\n%s", missing, err, out)
	}
	return nil
}

// containerdConfig: CRI on cgroupfs (runc's default), the locally imported
// pause image, the cluster's own CNI directories, and no oom_score_adj
// below the runtime's own (see e2e/README.md).
const containerdConfig = `version = 2
root = "%[1]s/containerd"
state = "%[2]s/containerd/state"
[grpc]
  address = "%[3]s"
[ttrpc]
  address = "%[3]s.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[4]s"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[5]s"
    conf_dir = "%[6]s"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`

// containerdCommand writes containerd's config and returns its command.
func (c *Config) containerdCommand() (nodeProc, error) {
	if err := os.MkdirAll(filepath.Join(RunDir, "containerd"), 0o755); err != nil {
		return nodeProc{}, err
	}
	cfg := filepath.Join(StateDir, "containerd.toml")
	text := fmt.Sprintf(containerdConfig, StateDir, RunDir, containerdSock(), PauseImage, cniBinDir(), cniConfDir())
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		return nodeProc{}, err
	}
	return nodeProc{Name: "containerd", Bin: "/usr/bin/containerd", Args: []string{"--config", cfg}}, nil
}

func (c *Config) waitContainerd(ctx context.Context) error {
	return waitFor(ctx, "containerd", time.Minute, func() (bool, error) {
		if !running("node") {
			return false, fmt.Errorf("the node exited (see %s)", filepath.Join(c.LogDir(), "node.log"))
		}
		return exec.CommandContext(ctx, "ctr", "--address", containerdSock(), "version").Run() == nil, nil
	})
}

// importImages imports every archive in ImageDir and gozt's image, tags
// gozt's image with the reference the ztunnel values name, and tags it
// once more as RollImage(goztRef), the second tag a DaemonSet roll moves to.
func (c *Config) importImages(ctx context.Context, goztRef string) error {
	archives, err := filepath.Glob(filepath.Join(c.ImageDir(), "*.tar"))
	if err != nil {
		return err
	}
	archives = append(archives, filepath.Join(c.Repo, "bin", "gozt-image.tar"))
	for _, a := range archives {
		if err := c.ctr(ctx, "images", "import", a); err != nil {
			return err
		}
	}
	out, err := exec.CommandContext(ctx, "ctr", "--address", containerdSock(), "-n", containerNS, "images", "ls", "-q").Output()
	if err != nil {
		return fmt.Errorf("ctr images ls: %w", err)
	}
	have := strings.Fields(string(out))
	if !slices.Contains(have, goztRef) {
		// make image names the image after `gozt version`; the values
		// file may name another tag of the same image.
		i := slices.IndexFunc(have, func(r string) bool { return strings.HasPrefix(r, repoOf(goztRef)+":") })
		if i < 0 {
			return fmt.Errorf("gozt's image: none of %v is %s", have, goztRef)
		}
		if err := c.ctr(ctx, "images", "tag", have[i], goztRef); err != nil {
			return err
		}
	}
	return c.ctr(ctx, "images", "tag", "--force", goztRef, RollImage(goztRef))
}

// RollImage is the second tag of gozt's image ref: the same image under
// another name, so that setting it on the DaemonSet rolls it as an
// upgrade would.
func RollImage(ref string) string { return ref + "-roll" }

func repoOf(ref string) string {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i]
	}
	return ref
}

func (c *Config) ctr(ctx context.Context, args ...string) error {
	return run(ctx, "ctr", append([]string{"--address", containerdSock(), "-n", containerNS}, args...)...)
}

// bridgeConflist is the pod network: Debian's bridge plugin with host-local
// addresses, which istio-cni's installer chains its plugin onto.
const bridgeConflist = `{
  "cniVersion": "1.0.0",
  "name": "gozt-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "%s",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "%s",
        "ranges": [[{"subnet": "%s"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`

// setupCNI lays out the CNI directories: the bin directory holds links to
// Debian's plugins (istio-cni's installer adds its own binary there), the
// config directory the bridge network.
func setupCNI() error {
	for _, d := range []string{cniBinDir(), cniConfDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	plugins, err := os.ReadDir(debianCNIDir)
	if err != nil {
		return fmt.Errorf("CNI plugins: %w", err)
	}
	for _, p := range plugins {
		if err := os.Symlink(filepath.Join(debianCNIDir, p.Name()), filepath.Join(cniBinDir(), p.Name())); err != nil && !os.IsExist(err) {
			return err
		}
	}
	conf := fmt.Sprintf(bridgeConflist, BridgeName, filepath.Join(StateDir, "cni", "ipam"), PodCIDR)
	return os.WriteFile(filepath.Join(cniConfDir(), "10-gozt-e2e.conflist"), []byte(conf), 0o644)
}

// sysctls the cluster needs, restored by Down from what Up saw.
var sysctls = map[string]string{
	"net/ipv4/ip_forward":                "1",
	"net/bridge/bridge-nf-call-iptables": "1",
}

func setSysctls() error {
	saved := ""
	for k, v := range sysctls {
		p := filepath.Join("/proc/sys", k)
		old, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		saved += k + " " + strings.TrimSpace(string(old)) + "\n"
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return os.WriteFile(filepath.Join(RunDir, "sysctls"), []byte(saved), 0o644)
}

func restoreSysctls() {
	b, err := os.ReadFile(filepath.Join(RunDir, "sysctls"))
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			os.WriteFile(filepath.Join("/proc/sys", f[0]), []byte(f[1]), 0o644)
		}
	}
}

// guardChain keeps pod traffic on this machine: a packet from the pod
// bridge to anywhere but the pod network, or one still addressed to the
// service range after kube-proxy's translation, is rejected.
const guardChain = "GOZT-E2E-GUARD"

func addGuard(ctx context.Context) error {
	if err := run(ctx, "iptables", "-N", guardChain); err != nil {
		return err
	}
	rules := [][]string{
		{"-A", guardChain, "-d", ServiceCIDR, "-j", "REJECT"},
		{"-A", guardChain, "-i", BridgeName, "!", "-d", ClusterCIDR, "-j", "REJECT"},
		{"-I", "FORWARD", "-j", guardChain},
		{"-I", "OUTPUT", "-d", ServiceCIDR, "-j", guardChain},
	}
	for _, r := range rules {
		if err := run(ctx, "iptables", r...); err != nil {
			return err
		}
	}
	return nil
}

// linkExists reports whether the network interface name exists.
func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}
