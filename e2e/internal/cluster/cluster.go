// Package cluster brings up and tears down the e2e cluster: a single-node
// Kubernetes made of host processes (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy, kubelet), Debian's
// containerd with the bridge CNI plugin, a small DNS server for the cluster
// domain, and Istio installed from its own charts with gozt as ztunnel.
//
// Every process it starts runs detached (its own session) with its pid in
// RunDir/pids, so a cluster outlives the command that started it (`make
// e2e-up`); Down stops exactly those processes, everything in the cluster's
// cgroups, and removes every mount, network namespace, iptables chain, link
// and file the cluster made, whether or not Up finished.
package cluster

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// Where the cluster keeps its state. Down removes all of it.
const (
	StateDir = "/var/lib/gozt-e2e" // etcd, PKI, containerd's root, kubelet's root, CNI
	RunDir   = "/run/gozt-e2e"     // sockets, pid files, containerd's state
	// CgroupName is the cgroup (under every v1 controller) that holds the
	// host processes and, as the kubelet's cgroupRoot, every pod.
	CgroupName = "gozt-e2e"
)

// Network and names. The pod and service ranges are routed only on this
// machine; a guard chain rejects pod traffic that would leave it.
const (
	NodeName      = "e2e-node"
	PodCIDR       = "10.244.0.0/24"
	ClusterCIDR   = "10.244.0.0/16"
	ServiceCIDR   = "10.96.0.0/16"
	KubeServiceIP = "10.96.0.1"
	ClusterDomain = "cluster.local"
	BridgeName    = "gozte2e0"
	etcdClient    = "127.0.0.1:12379"
	etcdPeer      = "127.0.0.1:12380"
	apiPort       = 6443
)

// Images the cluster imports; the charts are told these names.
const (
	IstioTag    = "1.31-dev"
	PilotImage  = "localhost/istio/pilot:" + IstioTag
	CNIImage    = "localhost/istio/install-cni:" + IstioTag
	PauseImage  = "localhost/gozt-e2e/pause:dev"
	EchoImage   = "localhost/gozt-e2e/echo:dev"
	k8sVersion  = "v1.34.4"
	containerNS = "k8s.io"
)

// Config says where the repository and its built artifacts are.
type Config struct {
	// Repo is the gozt repository's root.
	Repo string
	// NodeIP is the node's address; if empty, the address of the interface
	// of the default route.
	NodeIP string
}

// BinDir holds the built binaries, the image archives, the kubeconfig and
// the logs (bin/e2e in the repository).
func (c *Config) BinDir() string { return filepath.Join(c.Repo, "bin", "e2e") }

// LogDir holds each host component's log; it survives Down.
func (c *Config) LogDir() string { return filepath.Join(c.BinDir(), "logs") }

// ImageDir holds the image archives.
func (c *Config) ImageDir() string { return filepath.Join(c.BinDir(), "images") }

// Kubeconfig is the admin kubeconfig Up writes.
func (c *Config) Kubeconfig() string { return filepath.Join(c.BinDir(), "kubeconfig") }

func (c *Config) bin(name string) string { return filepath.Join(c.BinDir(), name) }

func pkiDir() string         { return filepath.Join(StateDir, "pki") }
func containerdSock() string { return filepath.Join(RunDir, "containerd", "containerd.sock") }
func cniBinDir() string      { return filepath.Join(StateDir, "cni", "bin") }
func cniConfDir() string     { return filepath.Join(StateDir, "cni", "net.d") }
func kubeletRoot() string    { return filepath.Join(StateDir, "kubelet") }
func podLogDir() string      { return filepath.Join(StateDir, "pod-logs") }

// nodeIP returns the configured node address or the one of the default
// route's interface.
func (c *Config) nodeIP() (string, error) {
	if c.NodeIP != "" {
		return c.NodeIP, nil
	}
	out, err := exec.Command("ip", "-4", "-o", "route", "show", "default").Output()
	if err != nil {
		return "", fmt.Errorf("ip route: %w", err)
	}
	f := strings.Fields(string(out))
	dev := ""
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "dev" {
			dev = f[i+1]
		}
	}
	if dev == "" {
		return "", fmt.Errorf("no default route (%q); set the node address", out)
	}
	out, err = exec.Command("ip", "-4", "-o", "addr", "show", "dev", dev, "scope", "global").Output()
	if err != nil {
		return "", fmt.Errorf("ip addr show %s: %w", dev, err)
	}
	f = strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "inet" {
			c.NodeIP = strings.Split(f[i+1], "/")[0]
			return c.NodeIP, nil
		}
	}
	return "", fmt.Errorf("no IPv4 address on %s", dev)
}
