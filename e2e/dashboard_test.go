package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// TestScenario10 is issue 37's tenth scenario: Prometheus, with the scrape
// jobs of Istio's own addon (samples/addons/prometheus.yaml), finds the gozt
// pod by the chart's prometheus.io annotations, scrapes its 15020, and every
// query of Istio's ztunnel Grafana dashboard returns data for that pod, the
// kubelet's cAdvisor series of its istio-proxy container included.
//
// Prometheus runs on the node as Debian's binary (the addon's image cannot
// be pulled here). Debian builds it without Kubernetes service discovery, so
// the test plays that part: it writes the discovery labels Kubernetes SD
// gives each pod and node (__meta_kubernetes_*) to file_sd files, read from
// the API server, and the addon's relabelling, unchanged, does the rest.
// The addon's in-cluster token becomes the admin client certificate for the
// kubelet's cAdvisor endpoint.
func TestScenario10(t *testing.T) {
	ctx := context.Background()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found (make e2e-build installs Debian's): %v", err)
	}
	istioDir, err := cluster.IstioDir(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	const ns = "e2e-s10"
	client, server, svcIP := meshPair(ctx, t, ns)
	sdDir := t.TempDir()
	writeDiscovery(ctx, t, sdDir)
	prom := startPrometheus(t, bin, addonScrapeConfig(t, istioDir, sdDir))

	const dials = 3
	for i := range dials {
		mustDial(ctx, t, client, net.JoinHostPort(svcIP, "80"), fmt.Sprintf("dashboard-%d", i))
	}
	gozt := goztPod(ctx, t)

	t.Run("TargetUp", func(t *testing.T) {
		prom.waitValue(t, fmt.Sprintf(`up{job="kubernetes-pods",pod=%q}`, gozt.Name), func(v float64) bool { return v == 1 })
	})
	t.Run("TrafficCarriesBothWorkloads", func(t *testing.T) {
		expr := fmt.Sprintf(`sum(istio_tcp_connections_opened_total{pod=%q,reporter="source",source_workload=%q,destination_workload=%q,destination_workload_namespace=%q})`,
			gozt.Name, client.Name, server.Name, ns)
		prom.waitValue(t, expr, func(v float64) bool { return v >= dials })
	})
	t.Run("EveryDashboardQueryHasData", func(t *testing.T) {
		qs := dashboardQueries(t, istioDir)
		var empty []string
		for end := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
			empty = empty[:0]
			for _, q := range qs {
				if !slices.ContainsFunc(prom.query(t, q), func(s promSample) bool {
					return s.Metric["pod"] == "" || s.Metric["pod"] == gozt.Name
				}) {
					empty = append(empty, q)
				}
			}
			if len(empty) == 0 || time.Now().After(end) {
				break
			}
		}
		t.Logf("%d dashboard queries, %d without data for %s", len(qs), len(empty), gozt.Name)
		for _, q := range empty {
			t.Errorf("dashboard query returns no data for %s: %s", gozt.Name, q)
		}
		if len(empty) > 0 {
			t.Logf("Prometheus targets: %s", prom.targets())
		}
	})
}

// addonScrapeConfig returns Prometheus's configuration for the node: the
// kubernetes-pods and kubernetes-nodes-cadvisor jobs of Istio's addon, with
// discovery from sdDir's files and credentials swapped as TestScenario10
// says, and a 2 s scrape interval.
func addonScrapeConfig(t *testing.T, istioDir, sdDir string) []byte {
	t.Helper()
	path := filepath.Join(istioDir, "samples", "addons", "prometheus.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("Istio's Prometheus addon: %v", err)
	}
	var text string
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if yaml.Unmarshal([]byte(doc), &cm) == nil && cm.Kind == "ConfigMap" && cm.Data["prometheus.yml"] != "" {
			text = cm.Data["prometheus.yml"]
		}
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil || text == "" {
		t.Fatalf("%s: no prometheus.yml in a ConfigMap (%v)", path, err)
	}
	pki := filepath.Join(cluster.StateDir, "pki")
	var jobs []any
	for _, j := range asSlice(cfg["scrape_configs"]) {
		job, _ := j.(map[string]any)
		if name := job["job_name"]; name != "kubernetes-pods" && name != "kubernetes-nodes-cadvisor" {
			continue
		}
		var role string
		for _, sd := range asSlice(job["kubernetes_sd_configs"]) {
			role, _ = sd.(map[string]any)["role"].(string)
		}
		if role != "pod" && role != "node" {
			t.Fatalf("%s: job %v discovers role %q", path, job["job_name"], role)
		}
		delete(job, "kubernetes_sd_configs")
		job["file_sd_configs"] = []any{map[string]any{"files": []any{filepath.Join(sdDir, role+".json")}}}
		if _, ok := job["bearer_token_file"]; ok {
			delete(job, "bearer_token_file")
			job["tls_config"] = map[string]any{
				"cert_file":            filepath.Join(pki, "admin.crt"),
				"key_file":             filepath.Join(pki, "admin.key"),
				"insecure_skip_verify": true, // as the addon: the kubelet's serving certificate is self-signed
			}
		}
		jobs = append(jobs, job)
	}
	if len(jobs) != 2 {
		t.Fatalf("%s: found %d of the 2 scrape jobs the dashboard needs; the addon's shape changed", path, len(jobs))
	}
	cfg["scrape_configs"] = jobs
	cfg["global"] = map[string]any{"scrape_interval": "2s", "scrape_timeout": "1s", "evaluation_interval": "2s"}
	out, err := json.Marshal(cfg) // JSON is YAML
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

// writeDiscovery writes pod.json and node.json to dir: for each running pod
// and each node, the target and the __meta_kubernetes_* labels that
// Prometheus's Kubernetes service discovery gives it (role pod: one target
// per pod at its IP, as for a pod that declares no container port).
func writeDiscovery(ctx context.Context, t *testing.T, dir string) {
	t.Helper()
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var pods, nodes []group
	pl, err := cl.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pl.Items {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		l := map[string]string{
			"__meta_kubernetes_namespace":           p.Namespace,
			"__meta_kubernetes_pod_name":            p.Name,
			"__meta_kubernetes_pod_ip":              p.Status.PodIP,
			"__meta_kubernetes_pod_node_name":       p.Spec.NodeName,
			"__meta_kubernetes_pod_phase":           string(p.Status.Phase),
			"__meta_kubernetes_pod_uid":             string(p.UID),
			"__meta_kubernetes_pod_host_ip":         p.Status.HostIP,
			"__meta_kubernetes_pod_ready":           fmt.Sprint(podReady(&p)),
			"__meta_kubernetes_pod_controller_kind": controllerKind(p.OwnerReferences),
		}
		for k, v := range p.Labels {
			l["__meta_kubernetes_pod_label_"+sdName(k)] = v
		}
		for k, v := range p.Annotations {
			l["__meta_kubernetes_pod_annotation_"+sdName(k)] = v
		}
		pods = append(pods, group{Targets: []string{p.Status.PodIP}, Labels: l})
	}
	nl, err := cl.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nl.Items {
		l := map[string]string{"__meta_kubernetes_node_name": n.Name}
		for k, v := range n.Labels {
			l["__meta_kubernetes_node_label_"+sdName(k)] = v
		}
		var ip string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ip = a.Address
			}
		}
		port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
		nodes = append(nodes, group{Targets: []string{net.JoinHostPort(ip, fmt.Sprint(port))}, Labels: l})
	}
	for name, groups := range map[string][]group{"pod.json": pods, "node.json": nodes} {
		b, err := json.Marshal(groups)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// sdName is a Kubernetes label or annotation key as a Prometheus label
// name: every character other than a letter, digit or underscore becomes
// an underscore.
func sdName(k string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, k)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func controllerKind(refs []metav1.OwnerReference) string {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return r.Kind
		}
	}
	return ""
}

// dashboardQueries returns every PromQL expression of Istio's ztunnel
// dashboard, with Grafana's range variables replaced by one minute.
func dashboardQueries(t *testing.T, istioDir string) []string {
	t.Helper()
	path := filepath.Join(istioDir, "manifests", "addons", "dashboards", "ztunnel-dashboard.gen.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("Istio's ztunnel dashboard: %v", err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vars := strings.NewReplacer("${__rate_interval}", "1m", "$__rate_interval", "1m",
		"${__interval}", "1m", "$__interval", "1m", "${__range}", "1m", "$__range", "1m")
	var qs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok && e != "" {
				qs = append(qs, vars.Replace(e))
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	slices.Sort(qs)
	qs = slices.Compact(qs)
	for _, q := range qs {
		if strings.Contains(q, "$") {
			t.Fatalf("dashboard query %q uses a Grafana variable this test does not replace", q)
		}
	}
	if len(qs) < 10 {
		t.Fatalf("found %d queries in %s; the dashboard's shape changed", len(qs), path)
	}
	return qs
}

// promServer is a Prometheus process on the node.
type promServer struct {
	base string // http://127.0.0.1:port
	log  string // its log file
}

// startPrometheus runs Prometheus with cfg and a temporary storage, until
// the test ends.
func startPrometheus(t *testing.T, bin string, cfg []byte) *promServer {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &promServer{base: "http://" + addr, log: filepath.Join(dir, "prometheus.log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		select {
		case err := <-exited:
			out, _ := os.ReadFile(p.log)
			t.Fatalf("prometheus exited at start (%v):\n%s", err, out)
		default:
		}
		if resp, err := http.Get(p.base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(end) {
			out, _ := os.ReadFile(p.log)
			t.Fatalf("prometheus not ready after 30s:\n%s", out)
		}
	}
}

// promSample is one element of an instant vector.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	var v float64
	str, _ := s.Value[1].(string)
	fmt.Sscan(str, &v)
	return v
}

// query runs expr as an instant query; a query Prometheus rejects fails the
// test.
func (p *promServer) query(t *testing.T, expr string) []promSample {
	t.Helper()
	resp, err := http.Get(p.base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		t.Fatalf("query %q: %v", expr, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status, Error string
		Data          struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %q: %v", expr, err)
	}
	if r.Status != "success" || r.Data.ResultType != "vector" {
		t.Fatalf("query %q: %s %s: %s", expr, r.Status, r.Data.ResultType, r.Error)
	}
	return r.Data.Result
}

// waitValue waits up to a minute for expr to return one sample for which
// ok holds.
func (p *promServer) waitValue(t *testing.T, expr string, ok func(float64) bool) {
	t.Helper()
	var res []promSample
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		if res = p.query(t, expr); len(res) == 1 && ok(res[0].value()) {
			t.Logf("%s = %v", expr, res[0].value())
			return
		}
	}
	t.Fatalf("Prometheus: %s = %+v after a minute; targets: %s", expr, res, p.targets())
}

// targets is Prometheus's view of its scrapes, for failure messages.
func (p *promServer) targets() string {
	resp, err := http.Get(p.base + "/api/v1/targets?state=active")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	return string(b)
}
