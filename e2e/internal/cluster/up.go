package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Up brings the cluster up from nothing (it runs Down first) and returns
// once every Istio pod and gozt's are Ready; the binaries and image
// archives must have been built (Build). Progress goes to w.
func (c *Config) Up(ctx context.Context, w io.Writer) error {
	step := func(what string) func() {
		start := time.Now()
		fmt.Fprintf(w, "e2e: %s...\n", what)
		return func() { fmt.Fprintf(w, "e2e: %s done (%v)\n", what, time.Since(start).Round(100*time.Millisecond)) }
	}
	if err := c.Down(ctx); err != nil {
		fmt.Fprintf(w, "e2e: cleaning up a previous cluster: %v\n", err)
	}
	goztRef, err := c.GoztImage()
	if err != nil {
		return err
	}
	istioDir, err := IstioDir(ctx, filepath.Join(c.Repo, "e2e"))
	if err != nil {
		return err
	}
	// Build, which must have run, installed the Debian packages.
	nodeIP, err := c.nodeIP()
	if err != nil {
		return err
	}
	for _, d := range []string{StateDir, RunDir, c.LogDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := setSysctls(); err != nil {
		return err
	}
	if err := c.writePKI(nodeIP); err != nil {
		return err
	}
	// The kubeconfig goes out first, so that a cluster that fails to come
	// up can be looked at.
	if err := c.writeUserFiles(); err != nil {
		return err
	}
	done := step("start etcd and the control plane")
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx, nodeIP); err != nil {
		return err
	}
	if err := c.startControllers(); err != nil {
		return err
	}
	done()
	done = step("start the node (containerd, kubelet) and import images")
	if err := setupCNI(); err != nil {
		return err
	}
	if err := addGuard(ctx); err != nil {
		return err
	}
	ctrd, err := c.containerdCommand()
	if err != nil {
		return err
	}
	kubelet, err := c.kubeletCommand(nodeIP)
	if err != nil {
		return err
	}
	if err := c.startNode([]nodeProc{ctrd, kubelet}); err != nil {
		return err
	}
	if err := c.waitContainerd(ctx); err != nil {
		return err
	}
	if err := c.importImages(ctx, goztRef); err != nil {
		return err
	}
	done()
	done = step("start the DNS server and kube-proxy; wait for the node")
	if err := c.startDNS(nodeIP); err != nil {
		return err
	}
	if err := c.startKubeProxy(ctx); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return err
	}
	done()
	done = step("install Istio's charts")
	helmLog, err := os.Create(filepath.Join(c.LogDir(), "helm.log"))
	if err != nil {
		return err
	}
	defer helmLog.Close()
	if err := c.installIstio(ctx, istioDir, helmLog); err != nil {
		return err
	}
	done()
	done = step("wait for istiod, istio-cni and gozt")
	if err := c.waitIstioReady(ctx); err != nil {
		return err
	}
	done()
	return nil
}

// waitIstioReady waits until istiod's, istio-cni's and ztunnel's (gozt's)
// pods all exist and are Ready.
func (c *Config) waitIstioReady(ctx context.Context) error {
	cs, err := c.adminClient()
	if err != nil {
		return err
	}
	want := []string{"app=istiod", "k8s-app=istio-cni-node", "app=ztunnel"}
	return waitFor(ctx, "Istio's pods Ready", 6*time.Minute, func() (bool, error) {
		for _, sel := range want {
			pods, err := cs.CoreV1().Pods(IstioNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return false, err
			}
			if len(pods.Items) == 0 {
				return false, fmt.Errorf("no pod %s yet", sel)
			}
			for _, p := range pods.Items {
				if !PodReady(&p) {
					return false, fmt.Errorf("pod %s not ready: %s", p.Name, podStatus(&p))
				}
			}
		}
		return true, nil
	})
}

// PodReady reports whether p's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podStatus(p *corev1.Pod) string {
	var parts []string
	parts = append(parts, string(p.Status.Phase))
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch {
		case s.State.Waiting != nil:
			parts = append(parts, s.Name+": "+s.State.Waiting.Reason+" "+s.State.Waiting.Message)
		case s.State.Terminated != nil:
			parts = append(parts, s.Name+": terminated "+s.State.Terminated.Reason)
		case !s.Ready:
			parts = append(parts, s.Name+": not ready")
		}
	}
	return strings.Join(parts, "; ")
}

// writeUserFiles puts the admin kubeconfig in BinDir, beside kubectl and
// istioctl.
func (c *Config) writeUserFiles() error {
	b, err := os.ReadFile(filepath.Join(pkiDir(), "admin.kubeconfig"))
	if err != nil {
		return err
	}
	return os.WriteFile(c.Kubeconfig(), b, 0o600)
}
