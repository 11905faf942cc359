package cluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gozt/gozt/e2e/internal/ociarchive"
)

// k8sTools are the Kubernetes components, built by the module in e2e/k8s.
var k8sTools = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// istioTools are Istio's binaries, built by this module.
var istioTools = []string{
	"istio.io/istio/pilot/cmd/pilot-discovery",
	"istio.io/istio/cni/cmd/install-cni",
	"istio.io/istio/cni/cmd/istio-cni",
	"istio.io/istio/istioctl/cmd/istioctl",
}

// versionFlags stamps a release's version into its binaries, as the
// projects' own builds do: Helm checks the charts' kubeVersion against the
// API server's, and istioctl compares its version with istiod's.
func versionFlags(pkgs []string, vars map[string]string) string {
	var b strings.Builder
	b.WriteString("-s -w")
	for _, p := range pkgs {
		for _, k := range slices.Sorted(maps.Keys(vars)) {
			fmt.Fprintf(&b, " -X %s.%s=%s", p, k, vars[k])
		}
	}
	return b.String()
}

// Build builds every binary the cluster runs into BinDir (the Kubernetes
// and Istio builds side by side, as two go commands share two cores better
// than one does across their link steps) and then the image archives.
// `go build` skips what is up to date, so a second Build only checks.
// The Debian packages come first: the istio-cni image carries the host's
// iptables.
func (c *Config) Build(ctx context.Context, logf func(string, ...any)) error {
	if err := installPackages(ctx); err != nil {
		return err
	}
	e2eDir := filepath.Join(c.Repo, "e2e")
	if err := os.MkdirAll(c.BinDir(), 0o755); err != nil {
		return err
	}
	major, minor := "1", "34"
	k8sFlags := versionFlags([]string{"k8s.io/client-go/pkg/version", "k8s.io/component-base/version"},
		map[string]string{"gitVersion": k8sVersion, "gitMajor": major, "gitMinor": minor,
			"gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z"})
	istioFlags := versionFlags([]string{"istio.io/istio/pkg/version"},
		map[string]string{"buildVersion": IstioTag, "buildTag": IstioTag, "buildStatus": "Clean",
			"buildHub": "localhost/istio"})
	k8sPkgs := []string{"./cmd/etcd"}
	for _, t := range k8sTools {
		k8sPkgs = append(k8sPkgs, "k8s.io/kubernetes/cmd/"+t)
	}
	istioPkgs := append(slices.Clone(istioTools), "./cmd/pause", "./cmd/echo")
	var g errgroup.Group
	g.Go(func() error { return c.goBuild(ctx, logf, filepath.Join(e2eDir, "k8s"), k8sFlags, k8sPkgs) })
	g.Go(func() error { return c.goBuild(ctx, logf, e2eDir, istioFlags, istioPkgs) })
	if err := g.Wait(); err != nil {
		return err
	}
	return c.buildImages(logf)
}

func (c *Config) goBuild(ctx context.Context, logf func(string, ...any), dir, ldflags string, pkgs []string) error {
	start := time.Now()
	args := append([]string{"build", "-trimpath", "-ldflags=" + ldflags, "-o", c.BinDir() + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build in %s: %w\n%s", dir, err, out)
	}
	logf("built %d binaries in %s (%v)", len(pkgs), filepath.Base(dir), time.Since(start).Round(time.Second))
	return nil
}

// buildImages writes the image archives of istiod, istio-cni, the pause
// sandbox and the test app into ImageDir.
func (c *Config) buildImages(logf func(string, ...any)) error {
	if err := os.MkdirAll(c.ImageDir(), 0o755); err != nil {
		return err
	}
	tmp := ociarchive.File{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky}
	iptables, err := iptablesFiles()
	if err != nil {
		return err
	}
	images := map[string]ociarchive.Image{
		"pilot": {
			Ref: PilotImage, User: "1337:1337", Entrypoint: []string{"/usr/local/bin/pilot-discovery"},
			Files: []ociarchive.File{{Path: "/usr/local/bin/pilot-discovery", Src: c.bin("pilot-discovery")}, tmp},
		},
		"install-cni": {
			// As Istio's Dockerfile.install-cni, on the host's iptables
			// (which the node agent runs in each pod's namespace).
			Ref: CNIImage, Cmd: []string{"/usr/local/bin/install-cni"}, WorkingDir: "/opt/cni/bin",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cni/bin",
				"LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"},
			Files: append([]ociarchive.File{
				{Path: "/usr/local/bin/install-cni", Src: c.bin("install-cni")},
				{Path: "/opt/cni/bin/istio-cni", Src: c.bin("istio-cni")},
				{Path: "/run", Dir: true}, tmp,
			}, iptables...),
		},
		"pause": {
			Ref: PauseImage, Entrypoint: []string{"/pause"},
			Files: []ociarchive.File{{Path: "/pause", Src: c.bin("pause")}},
		},
		"echo": {
			Ref: EchoImage, Entrypoint: []string{"/echo"}, Cmd: []string{"serve"},
			Files: []ociarchive.File{{Path: "/echo", Src: c.bin("echo")}},
		},
	}
	for name, img := range images {
		out := filepath.Join(c.ImageDir(), name+".tar")
		if upToDate(out, img.Files) {
			continue
		}
		if err := ociarchive.Write(out, img); err != nil {
			return fmt.Errorf("image %s: %w", name, err)
		}
		logf("wrote %s (%s)", out, img.Ref)
	}
	return nil
}

// upToDate reports whether out is newer than every file it is made from.
func upToDate(out string, files []ociarchive.File) bool {
	st, err := os.Stat(out)
	if err != nil {
		return false
	}
	for _, f := range files {
		if f.Src == "" {
			continue
		}
		if fs, err := os.Stat(f.Src); err != nil || fs.ModTime().After(st.ModTime()) {
			return false
		}
	}
	return true
}

var lddPath = regexp.MustCompile(`(?m)(?:=> )?(/\S+) \(0x`)

// iptablesFiles returns Debian's iptables (both backends, every command
// name), its extensions, and the shared libraries they load, at their
// host paths.
func iptablesFiles() ([]ociarchive.File, error) {
	multis := []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi"}
	exts, err := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	if err != nil || len(exts) == 0 {
		return nil, fmt.Errorf("iptables extensions in /usr/lib/x86_64-linux-gnu/xtables: %v", err)
	}
	var files []ociarchive.File
	libs := map[string]bool{}
	for _, f := range append(slices.Clone(multis), exts...) {
		files = append(files, ociarchive.File{Path: f, Src: f})
		out, err := exec.Command("ldd", f).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", f, err)
		}
		for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
			libs[m[1]] = true
		}
	}
	for _, l := range slices.Sorted(maps.Keys(libs)) {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return nil, err
		}
		files = append(files, ociarchive.File{Path: l, Src: real})
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			files = append(files,
				ociarchive.File{Path: "/usr/sbin/" + fam + suffix, Link: "xtables-nft-multi"},
				ociarchive.File{Path: "/usr/sbin/" + fam + "-nft" + suffix, Link: "xtables-nft-multi"},
				ociarchive.File{Path: "/usr/sbin/" + fam + "-legacy" + suffix, Link: "xtables-legacy-multi"})
		}
	}
	return files, nil
}
