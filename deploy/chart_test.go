package deploy

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	valuesFile   = "ztunnel-values.yaml"
	manifestFile = "daemonset.yaml"
	ourImage     = "ghcr.io/gozt/gozt:0.1.0-dev" // what valuesFile and manifestFile name
	// chartNamespace is where Istio installs ztunnel, and the release's
	// namespace in every render.
	chartNamespace = "istio-system"
)

// chartDir is Istio's ztunnel chart in the module cache, from the
// istio.io/istio version that go.mod requires.
func chartDir(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	if err != nil {
		t.Fatalf("go list -m istio.io/istio: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "manifests", "charts", "ztunnel")
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		t.Fatalf("Istio's ztunnel chart: %v", err)
	}
	return dir
}

// render renders the chart as `helm install ztunnel CHART -n istio-system`
// with user values vals does, and returns its DaemonSet.
func render(t testing.TB, vals map[string]any) *appsv1.DaemonSet {
	t.Helper()
	chrt, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	opts := chartutil.ReleaseOptions{Name: "ztunnel", Namespace: chartNamespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatalf("chart values: %v", err)
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		t.Fatalf("render chart with %v: %v", vals, err)
	}
	var ds *appsv1.DaemonSet
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") { // NOTES.txt
			continue
		}
		for _, doc := range splitYAML(text) {
			if kindOf(t, name, doc) == "DaemonSet" {
				if ds != nil {
					t.Fatalf("chart rendered more than one DaemonSet")
				}
				ds = new(appsv1.DaemonSet)
				decodeStrict(t, name, doc, ds)
			}
		}
	}
	if ds == nil {
		t.Fatalf("chart rendered no DaemonSet with %v", vals)
	}
	return ds
}

// ourValues reads valuesFile as `helm install -f` does.
func ourValues(t testing.TB) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// withValues returns base with extra set over it (top-level keys only).
func withValues(base map[string]any, extra map[string]any) map[string]any {
	m := make(map[string]any, len(base)+len(extra))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// manifest reads manifestFile: its ServiceAccount and DaemonSet, decoded
// strictly, so a misspelt field fails.
func manifest(t testing.TB) (*corev1.ServiceAccount, *appsv1.DaemonSet) {
	t.Helper()
	data, err := os.ReadFile(manifestFile)
	if err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	var ds *appsv1.DaemonSet
	for _, doc := range splitYAML(string(data)) {
		switch k := kindOf(t, manifestFile, doc); k {
		case "ServiceAccount":
			sa = new(corev1.ServiceAccount)
			decodeStrict(t, manifestFile, doc, sa)
		case "DaemonSet":
			ds = new(appsv1.DaemonSet)
			decodeStrict(t, manifestFile, doc, ds)
		default:
			t.Fatalf("%s: unexpected kind %q", manifestFile, k)
		}
	}
	if sa == nil || ds == nil {
		t.Fatalf("%s: want a ServiceAccount and a DaemonSet", manifestFile)
	}
	return sa, ds
}

// splitYAML splits a multi-document YAML stream, dropping empty documents.
func splitYAML(s string) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(s, -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(s string) string {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(s, "")
}

func kindOf(t testing.TB, name, doc string) string {
	t.Helper()
	var meta struct{ Kind string }
	if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return meta.Kind
}

func decodeStrict(t testing.TB, name, doc string, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// container returns the DaemonSet's one container.
func container(t testing.TB, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 || len(ds.Spec.Template.Spec.InitContainers) != 0 {
		t.Fatalf("DaemonSet has %d containers and %d init containers, want one container",
			len(cs), len(ds.Spec.Template.Spec.InitContainers))
	}
	return &cs[0]
}

// renders are the chart's DaemonSets that the tests check, by name.
func renders(t *testing.T) map[string]*appsv1.DaemonSet {
	ours := ourValues(t)
	ambient := map[string]any{"profile": "ambient"}
	return map[string]*appsv1.DaemonSet{
		"chart defaults":       render(t, nil),
		"chart ambient":        render(t, ambient),
		"our values":           render(t, ours),
		"our values, ambient":  render(t, withValues(ours, ambient)),
		"every env option set": render(t, withValues(ours, everyEnvOption)),
	}
}

// everyEnvOption sets each chart value that adds a variable to the
// container's environment (the chart's templates/daemonset.yaml). gozt must
// understand the names; it need not start with them (CRL_PATH is refused).
var everyEnvOption = map[string]any{
	"profile":              "ambient",
	"logAsJson":            true,
	"network":              "network-1",
	"multiCluster":         map[string]any{"clusterName": "cluster-1"},
	"peerCaCrl":            map[string]any{"enabled": true},
	"resources":            map[string]any{"limits": map[string]any{"cpu": "2"}, "requests": map[string]any{"cpu": "500m"}},
	"revision":             "canary",
	"logLevel":             "info,access=debug",
	"xdsAddress":           "istiod-canary.istio-system.svc:15012",
	"caAddress":            "istiod-canary.istio-system.svc:15012",
	"istioNamespace":       "istio-system",
	"resourceName":         "ztunnel",
	"imagePullPolicy":      "IfNotPresent",
	"seLinuxOptions":       map[string]any{"type": "spc_t"},
	"podLabels":            map[string]any{"team": "mesh"},
	"compatibilityVersion": "1.29",
}

// TestChartImage: with our values the chart runs our image, as given, with
// and without the ambient profile, whose variant would otherwise make the
// tag "-distroless".
func TestChartImage(t *testing.T) {
	rs := renders(t)
	for name, want := range map[string]string{
		"chart defaults":      "registry.istio.io/testing/ztunnel:latest",
		"chart ambient":       "registry.istio.io/testing/ztunnel:latest-distroless",
		"our values":          ourImage,
		"our values, ambient": ourImage,
	} {
		if got := container(t, rs[name]).Image; got != want {
			t.Errorf("%s: image %q, want %q", name, got, want)
		}
	}
	if got := container(t, rs["our values, ambient"]).Image; strings.Contains(got, "distroless") {
		t.Errorf("our values with profile=ambient: image %q has the distroless variant", got)
	}
	_, ds := manifest(t)
	if got := container(t, ds).Image; got != ourImage {
		t.Errorf("%s: image %q, want %q", manifestFile, got, ourImage)
	}
}

// TestManifestMatchesChart: our DaemonSet is the chart's with our values
// and the ambient profile, Helm's bookkeeping labels aside.
func TestManifestMatchesChart(t *testing.T) {
	sa, ds := manifest(t)
	chart := render(t, withValues(ourValues(t), map[string]any{"profile": "ambient"}))
	if diff := cmp.Diff(chart.Spec.Template.Spec, ds.Spec.Template.Spec); diff != "" {
		t.Errorf("%s pod spec differs from the chart's (-chart +ours):\n%s", manifestFile, diff)
	}
	if diff := cmp.Diff(chart.Spec.Selector, ds.Spec.Selector); diff != "" {
		t.Errorf("selector differs (-chart +ours):\n%s", diff)
	}
	if diff := cmp.Diff(chart.Spec.UpdateStrategy, ds.Spec.UpdateStrategy); diff != "" {
		t.Errorf("update strategy differs (-chart +ours):\n%s", diff)
	}
	if diff := cmp.Diff(chart.Spec.Template.Annotations, ds.Spec.Template.Annotations); diff != "" {
		t.Errorf("pod annotations differ (-chart +ours):\n%s", diff)
	}
	for k, v := range chart.Spec.Template.Labels {
		if helmLabel(k) {
			continue
		}
		if got, ok := ds.Spec.Template.Labels[k]; !ok || got != v {
			t.Errorf("pod label %s = %q, want the chart's %q", k, got, v)
		}
	}
	if ds.Name != chart.Name || ds.Namespace != chart.Namespace {
		t.Errorf("DaemonSet %s/%s, want the chart's %s/%s", ds.Namespace, ds.Name, chart.Namespace, chart.Name)
	}
	if sa.Name != ds.Spec.Template.Spec.ServiceAccountName || sa.Namespace != ds.Namespace {
		t.Errorf("ServiceAccount %s/%s, want %s/%s", sa.Namespace, sa.Name, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
	}
}

// helmLabel reports whether a chart label records the Helm release rather
// than selecting or describing the pod.
func helmLabel(k string) bool {
	switch k {
	case "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version", "helm.sh/chart":
		return true
	}
	return false
}

// TestContainerUnderstood: every variable, argument, port and probe of
// each DaemonSet is one gozt knows. A variable is either read by gozt
// (envconfig or main) or listed in docs/reference.md as set by the chart and read
// by nothing, with the reason; TestChartStartsGozt then runs the binary
// with it.
func TestContainerUnderstood(t *testing.T) {
	read, prefixes := goztVariables(t)
	unused := readmeUnused(t)
	for _, name := range []string{"INPOD_ENABLED", "RUST_BACKTRACE"} {
		if !unused[name] {
			t.Errorf("docs/reference.md's variable table does not list %s as read by nothing", name)
		}
	}
	for name := range unused {
		if read[name] {
			t.Errorf("docs/reference.md says nothing reads %s, but gozt does", name)
		}
	}
	all := renders(t)
	_, all[manifestFile] = manifest(t)
	for src, ds := range all {
		c := container(t, ds)
		for _, e := range c.Env {
			if !read[e.Name] && !hasPrefix(e.Name, prefixes) && !unused[e.Name] {
				t.Errorf("%s: variable %s is neither read by gozt nor listed in docs/reference.md as unused", src, e.Name)
			}
		}
		checkShape(t, src, c)
	}
}

// checkShape checks what gozt does not read through its environment: the
// command, arguments, ports and probes.
func checkShape(t *testing.T, src string, c *corev1.Container) {
	t.Helper()
	if len(c.Command) != 0 {
		t.Errorf("%s: command %q, want the image's entrypoint", src, c.Command)
	}
	if want := []string{"proxy", "ztunnel"}; !slices.Equal(c.Args, want) {
		t.Errorf("%s: args %q, want %q", src, c.Args, want)
	}
	for _, p := range c.Ports {
		if p.ContainerPort != 15020 || p.Protocol != corev1.ProtocolTCP {
			t.Errorf("%s: port %v: gozt serves metrics on TCP 15020 and nothing else the pod publishes", src, p)
		}
	}
	if c.LivenessProbe != nil || c.StartupProbe != nil {
		t.Errorf("%s: liveness or startup probe: gozt answers only readiness", src)
	}
	p := c.ReadinessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 15021 || p.HTTPGet.Path != "/healthz/ready" || p.HTTPGet.Host != "" {
		t.Errorf("%s: readiness probe %+v, want GET /healthz/ready on the pod IP's 15021", src, p)
	}
}

func hasPrefix(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) && len(name) > len(p) {
			return true
		}
	}
	return false
}

// goztVariables returns the variable names gozt proxy reads: the
// upper-case string constants of internal/envconfig and
// cmd/gozt/main.go, and those ending in "_" as prefixes (ISTIO_META_,
// XDS_HEADER_, ...).
func goztVariables(t *testing.T) (names map[string]bool, prefixes []string) {
	t.Helper()
	sources, err := filepath.Glob("../internal/envconfig/*.go")
	if err != nil {
		t.Fatal(err)
	}
	sources = slices.DeleteFunc(sources, func(p string) bool { return strings.HasSuffix(p, "_test.go") })
	sources = append(sources, "../cmd/gozt/main.go")
	isVar := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	names = make(map[string]bool)
	fset := token.NewFileSet()
	for _, path := range sources {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !isVar.MatchString(s) {
				return true
			}
			if strings.HasSuffix(s, "_") {
				prefixes = append(prefixes, s)
			} else {
				names[s] = true
			}
			return true
		})
	}
	if !names["XDS_ADDRESS"] || !slices.Contains(prefixes, "ISTIO_META_") {
		t.Fatalf("found no XDS_ADDRESS or ISTIO_META_ in %v: the sources moved?", sources)
	}
	return names, prefixes
}

// readmeUnused returns the variables that docs/reference.md's `gozt proxy` table
// lists as read by nothing.
func readmeUnused(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := bytes.Cut(data, []byte("\n## `gozt proxy`"))
	if !ok {
		t.Fatal("docs/reference.md has no `gozt proxy` section")
	}
	section, _, _ = bytes.Cut(section, []byte("\n## "))
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
	unused := make(map[string]bool)
	for _, line := range strings.Split(string(section), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(line, "read by nothing") {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			unused[m[1]] = true
		}
	}
	return unused
}

var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// goztBinary returns, once per test binary, the gozt the image holds: it
// builds gozt as `make image` does (static, -trimpath), packs it with
// deploy/image into an image archive, and unpacks /usr/local/bin/gozt from
// that archive's layer, so the DaemonSet tests run the image's own binary.
func goztBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "gozt-deploy-bin")
		if built.err != nil {
			return
		}
		raw, archive := filepath.Join(built.dir, "gozt-build"), filepath.Join(built.dir, "image.tar")
		steps := [][]string{
			{"go", "build", "-trimpath", "-o", raw, "./cmd/gozt"},
			{"go", "run", "./deploy/image", "-bin", raw, "-o", archive},
		}
		for _, args := range steps {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Dir = ".."
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				built.err = fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
		built.bin = filepath.Join(built.dir, "gozt")
		built.err = unpackEntrypoint(archive, built.bin)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// unpackEntrypoint writes the image's /usr/local/bin/gozt, read from the
// archive's layers, to dst.
func unpackEntrypoint(archive, dst string) error {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("read image archive: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return err
			}
			if strings.TrimPrefix(h.Name, "/") != "usr/local/bin/gozt" || h.Typeflag != tar.TypeReg {
				continue
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
			if err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
			rc.Close()
			return err
		}
		rc.Close()
	}
	return errors.New("image archive has no /usr/local/bin/gozt")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// TestImageTagIsVersion: the image our values and manifest name is the one
// `make image` tags by default, ghcr.io/gozt/gozt:VERSION.
func TestImageTagIsVersion(t *testing.T) {
	out, err := exec.Command(goztBinary(t), "version").Output()
	if err != nil {
		t.Fatalf("gozt version: %v", err)
	}
	if want := "ghcr.io/gozt/gozt:" + strings.TrimPrefix(strings.TrimSpace(string(out)), "gozt "); ourImage != want {
		t.Errorf("%s and %s name %s, but make image tags %s: update both", valuesFile, manifestFile, ourImage, want)
	}
}
