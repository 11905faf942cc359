package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"
)

// IstioNamespace is where the charts install Istio and gozt.
const IstioNamespace = "istio-system"

// IstioDir returns the istio.io/istio module's directory in the module
// cache, at the version this module requires (the one gozt's go.mod pins).
func IstioDir(ctx context.Context, e2eDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio")
	cmd.Dir = e2eDir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m istio.io/istio: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// release is one Helm release of one of Istio's charts.
type release struct {
	name  string
	chart string // under manifests/charts
	vals  map[string]any
}

// releases are Istio's charts with the values the cluster needs: the
// ambient profile, the locally built images (never pulled), and istio-cni
// pointed at the cluster's CNI directories. ztunnel gets exactly gozt's
// deploy/ztunnel-values.yaml and the profile, as a user would install it.
func (c *Config) releases() ([]release, error) {
	zvals, err := readValues(filepath.Join(c.Repo, "deploy", "ztunnel-values.yaml"))
	if err != nil {
		return nil, err
	}
	zvals["profile"] = "ambient"
	return []release{
		{"istio-base", "base", map[string]any{"defaultRevision": "default"}},
		{"istiod", "istio-control/istio-discovery", map[string]any{
			"profile": "ambient",
			"image":   PilotImage,
			"global":  map[string]any{"imagePullPolicy": "Never"},
			// One replica, no autoscaler: a single node with two cores.
			"autoscaleEnabled": false,
			"resources":        map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}},
		}},
		{"istio-cni", "istio-cni", map[string]any{
			"profile":    "ambient",
			"image":      CNIImage,
			"pullPolicy": "Never",
			"cniBinDir":  cniBinDir(),
			"cniConfDir": cniConfDir(),
		}},
		{"ztunnel", "ztunnel", zvals},
	}, nil
}

// GoztImage returns the image reference deploy/ztunnel-values.yaml names.
func (c *Config) GoztImage() (string, error) {
	v, err := readValues(filepath.Join(c.Repo, "deploy", "ztunnel-values.yaml"))
	if err != nil {
		return "", err
	}
	ref, _ := v["image"].(string)
	if !strings.Contains(ref, "/") {
		return "", fmt.Errorf("deploy/ztunnel-values.yaml: image %q is not a full reference", ref)
	}
	return ref, nil
}

func readValues(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	v := map[string]any{}
	if err := yaml.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// installIstio installs the releases in order with Helm's Go SDK, from the
// charts in the module cache, unedited. Helm does not wait; the caller
// waits for the pods.
func (c *Config) installIstio(ctx context.Context, istioDir string, logw io.Writer) error {
	rels, err := c.releases()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(pkiDir(), "admin.kubeconfig")
	for _, r := range rels {
		ns := IstioNamespace
		getter := genericclioptions.NewConfigFlags(false)
		getter.KubeConfig = &kubeconfig
		getter.Namespace = &ns
		cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(logw, nil)))
		if err := cfg.Init(getter, ns, "secret"); err != nil {
			return fmt.Errorf("helm %s: %w", r.name, err)
		}
		chrt, err := loader.Load(filepath.Join(istioDir, "manifests", "charts", r.chart))
		if err != nil {
			return fmt.Errorf("load chart %s: %w", r.chart, err)
		}
		in := action.NewInstall(cfg)
		in.ReleaseName = r.name
		in.Namespace = ns
		in.CreateNamespace = true
		in.WaitStrategy = kube.HookOnlyStrategy
		in.Timeout = 5 * time.Minute
		if _, err := in.RunWithContext(ctx, chrt, r.vals); err != nil {
			return fmt.Errorf("helm install %s: %w", r.name, err)
		}
		fmt.Fprintf(logw, "helm: installed %s (%s)\n", r.name, r.chart)
	}
	return nil
}
