package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// startEtcd starts etcd on loopback ports of its own, without fsync (the
// cluster lives for one test run), and waits until it is healthy.
func (c *Config) startEtcd(ctx context.Context) error {
	args := []string{
		"--name=e2e", "--data-dir=" + filepath.Join(StateDir, "etcd"),
		"--listen-client-urls=http://" + etcdClient, "--advertise-client-urls=http://" + etcdClient,
		"--listen-peer-urls=http://" + etcdPeer, "--initial-advertise-peer-urls=http://" + etcdPeer,
		"--initial-cluster=e2e=http://" + etcdPeer, "--unsafe-no-fsync", "--log-level=warn",
	}
	if err := c.start("etcd", c.bin("etcd"), args, nil); err != nil {
		return err
	}
	return waitFor(ctx, "etcd", time.Minute, func() (bool, error) {
		resp, err := http.Get("http://" + etcdClient + "/health")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (c *Config) startAPIServer(ctx context.Context, nodeIP string) error {
	p := func(f string) string { return filepath.Join(pkiDir(), f) }
	args := []string{
		"--etcd-servers=http://" + etcdClient,
		"--advertise-address=" + nodeIP, fmt.Sprintf("--secure-port=%d", apiPort),
		"--service-cluster-ip-range=" + ServiceCIDR, "--allow-privileged=true",
		"--authorization-mode=Node,RBAC",
		"--client-ca-file=" + p("ca.crt"),
		"--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
		"--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
		// The node's name does not resolve on this machine.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-issuer=https://kubernetes.default.svc." + ClusterDomain,
		"--service-account-key-file=" + p("sa.pub"), "--service-account-signing-key-file=" + p("sa.key"),
		"--profiling=false", "--v=1",
	}
	if err := c.start("kube-apiserver", c.bin("kube-apiserver"), args, nil); err != nil {
		return err
	}
	cs, err := c.adminClient()
	if err != nil {
		return err
	}
	return waitFor(ctx, "kube-apiserver /readyz", 3*time.Minute, func() (bool, error) {
		if !running("kube-apiserver") {
			return false, fmt.Errorf("kube-apiserver exited (see %s)", filepath.Join(c.LogDir(), "kube-apiserver.log"))
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, err
		}
		return string(body) == "ok", nil
	})
}

func (c *Config) startControllers() error {
	p := func(f string) string { return filepath.Join(pkiDir(), f) }
	kc := p("controller-manager.kubeconfig")
	cm := []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p("sa.key"), "--root-ca-file=" + p("ca.crt"),
		"--cluster-signing-cert-file=" + p("ca.crt"), "--cluster-signing-key-file=" + p("ca.key"),
		"--service-cluster-ip-range=" + ServiceCIDR, "--secure-port=0", "--v=1",
	}
	if err := c.start("kube-controller-manager", c.bin("kube-controller-manager"), cm, nil); err != nil {
		return err
	}
	sk := p("scheduler.kubeconfig")
	sched := []string{"--kubeconfig=" + sk, "--authentication-kubeconfig=" + sk,
		"--authorization-kubeconfig=" + sk, "--leader-elect=false", "--secure-port=0", "--v=1"}
	return c.start("kube-scheduler", c.bin("kube-scheduler"), sched, nil)
}

// startKubeProxy runs kube-proxy in iptables mode, touching no sysctl it
// need not (conntrack sizes and timeouts, route_localnet).
func (c *Config) startKubeProxy(ctx context.Context) error {
	args := []string{
		"--kubeconfig=" + filepath.Join(pkiDir(), "kube-proxy.kubeconfig"),
		"--hostname-override=" + NodeName, "--proxy-mode=iptables", "--cluster-cidr=" + ClusterCIDR,
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0", "--iptables-localhost-nodeports=false",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249", "--v=1",
	}
	if err := c.start("kube-proxy", c.bin("kube-proxy"), args, nil); err != nil {
		return err
	}
	// Wait for the kubernetes Service's rules, so that no pod starts before
	// its ClusterIPs are translated.
	return waitFor(ctx, "kube-proxy rules", 2*time.Minute, func() (bool, error) {
		if !running("kube-proxy") {
			return false, fmt.Errorf("kube-proxy exited")
		}
		out, err := iptablesSave("iptables")
		if err != nil {
			return false, err
		}
		return containsLine(out, "-d "+KubeServiceIP+"/32"), nil
	})
}

// kubeletConfig is the kubelet's configuration file; each setting that this
// machine needs is explained in e2e/README.md.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[1]s/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /%[2]s
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%[3]s
clusterDNS: [%[4]s]
clusterDomain: %[5]s
resolvConf: %[6]s
podLogsDir: %[7]s
staticPodPath: ""
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 50
`

// kubeletCommand writes the kubelet's configuration and returns its
// command.
func (c *Config) kubeletCommand(nodeIP string) (nodeProc, error) {
	dir := filepath.Join(StateDir, "kubelet-config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nodeProc{}, err
	}
	// Pods that resolve through the host's resolver (hostNetwork with the
	// Default policy) get the cluster's DNS server too.
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+nodeIP+"\n"), 0o644); err != nil {
		return nodeProc{}, err
	}
	cfg := filepath.Join(dir, "config.yaml")
	text := fmt.Sprintf(kubeletConfig, pkiDir(), CgroupName, containerdSock(), nodeIP, ClusterDomain, resolv, podLogDir())
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		return nodeProc{}, err
	}
	args := []string{
		"--config=" + cfg, "--kubeconfig=" + filepath.Join(pkiDir(), "kubelet.kubeconfig"),
		"--root-dir=" + kubeletRoot(), "--cert-dir=" + filepath.Join(StateDir, "kubelet-pki"),
		"--hostname-override=" + NodeName, "--node-ip=" + nodeIP, "--v=1",
		// cAdvisor's containerd handler (the container="..." series of
		// /metrics/cadvisor, which Istio's dashboard reads) looks for the
		// default socket unless told; this flag has no config-file field.
		"--containerd=" + containerdSock(),
	}
	return nodeProc{Name: "kubelet", Bin: c.bin("kubelet"), Args: args}, nil
}

func (c *Config) waitNodeReady(ctx context.Context) error {
	cs, err := c.adminClient()
	if err != nil {
		return err
	}
	return waitFor(ctx, "node Ready", 3*time.Minute, func() (bool, error) {
		if !running("node") {
			return false, fmt.Errorf("the node exited (see %s)", filepath.Join(c.LogDir(), "kubelet.log"))
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status != corev1.ConditionTrue {
					return false, fmt.Errorf("node not ready: %s", cond.Message)
				}
				return true, nil
			}
		}
		return false, nil
	})
}

func (c *Config) adminClient() (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(pkiDir(), "admin.kubeconfig"))
	if err != nil {
		return nil, err
	}
	rc.Timeout = 15 * time.Second
	return kubernetes.NewForConfig(rc)
}
