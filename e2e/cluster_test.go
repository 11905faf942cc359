// Package e2e holds gozt's real-cluster scenarios. They run against a
// cluster that `gozt-e2e up` brought up (make e2e does both, then tears it
// down), found through GOZT_E2E_KUBECONFIG; without it they skip, loudly,
// or fail under GOZT_REQUIRE_ROOT=1 (CI), where a skip must not pass.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// env is the cluster under test.
type env struct {
	cs         *kubernetes.Clientset
	rc         *rest.Config
	kubeconfig string // its path (GOZT_E2E_KUBECONFIG)
	repo       string
}

var cl *env

func TestMain(m *testing.M) {
	kc := os.Getenv("GOZT_E2E_KUBECONFIG")
	if kc == "" {
		if os.Getenv("GOZT_REQUIRE_ROOT") == "1" {
			fmt.Fprintln(os.Stderr, "e2e: FAILING: GOZT_E2E_KUBECONFIG is not set and GOZT_REQUIRE_ROOT=1 (run `make e2e` as root)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "e2e: GOZT_E2E_KUBECONFIG is not set: SKIPPING the real-cluster scenarios (run `make e2e` as root)")
		os.Exit(0)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	cl = &env{cs: kubernetes.NewForConfigOrDie(rc), rc: rc, kubeconfig: kc, repo: ".."}
	os.Exit(m.Run())
}

// TestScenario1 is issue 37's first scenario: every Istio pod and gozt's
// become Ready, gozt's readiness waits for istio-cni's ZDS snapshot, and
// /config_dump's workloadState lists the enrolled pods.
func TestScenario1(t *testing.T) {
	ctx := context.Background()
	t.Run("IstioAndGoztReady", func(t *testing.T) { testIstioReady(ctx, t) })
	pod := createEnrolledPod(ctx, t, "e2e-s1", "echo")
	t.Run("WorkloadStateListsEnrolledPod", func(t *testing.T) {
		waitWorkloadState(ctx, t, pod, 90*time.Second)
	})
	t.Run("ReadyOnlyAfterZDSSnapshot", func(t *testing.T) {
		testReadyAfterSnapshot(ctx, t)
		// The new gozt learnt the pod from istio-cni's snapshot alone.
		waitWorkloadState(ctx, t, pod, 90*time.Second)
	})
}

func testIstioReady(ctx context.Context, t *testing.T) {
	want, err := (&cluster.Config{Repo: cl.repo}).GoztImage()
	if err != nil {
		t.Fatal(err)
	}
	for _, sel := range []string{"app=istiod", "k8s-app=istio-cni-node", "app=ztunnel"} {
		pods := waitPodsReady(ctx, t, cluster.IstioNamespace, sel, 5*time.Minute)
		t.Logf("%s: %d pod(s) ready", sel, len(pods))
		if sel != "app=ztunnel" {
			continue
		}
		for _, p := range pods {
			if got := p.Spec.Containers[0].Image; got != want {
				t.Errorf("ztunnel pod %s runs %s, want gozt's %s", p.Name, got, want)
			}
		}
	}
}

// waitPodsReady waits until the pods selected by sel exist and are all
// Ready, and returns them.
func waitPodsReady(ctx context.Context, t *testing.T, ns, sel string, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var last string
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		pods, err := cl.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		switch {
		case err != nil:
			last = err.Error()
		case len(pods.Items) == 0:
			last = "no pods"
		default:
			ready := true
			for i := range pods.Items {
				p := &pods.Items[i]
				if !cluster.PodReady(p) || p.DeletionTimestamp != nil {
					ready = false
					last = fmt.Sprintf("%s: %s", p.Name, p.Status.Phase)
				}
			}
			if ready {
				return pods.Items
			}
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("pods %s in %s not Ready after %v: %s", sel, ns, timeout, last)
	return nil
}

// createEnrolledPod creates an ambient namespace with one echo pod and
// waits until istio-cni has redirected it.
func createEnrolledPod(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	createNamespace(ctx, t, ns, true)
	return createEchoPods(ctx, t, ns, nil, name)[name]
}

func waitServiceAccount(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	for i := 0; i < 60; i++ {
		if _, err := cl.cs.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("service account %s/%s never appeared", ns, name)
}

// workloadState is the part of gozt's /config_dump this scenario reads.
type workloadState map[string]struct {
	State string `json:"state"`
	Info  struct {
		Name, Namespace, ServiceAccount string
	} `json:"info"`
}

// waitWorkloadState waits until gozt's /config_dump lists pod as Up.
func waitWorkloadState(ctx context.Context, t *testing.T, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	var last string
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ws, err := readWorkloadState(ctx, t)
		if err != nil {
			last = err.Error()
		} else if w, ok := ws[string(pod.UID)]; !ok {
			last = fmt.Sprintf("pod uid %s not in workloadState (%d entries)", pod.UID, len(ws))
		} else if w.State != "Up" || w.Info.Name != pod.Name || w.Info.Namespace != pod.Namespace {
			last = fmt.Sprintf("workloadState[%s] = %+v", pod.UID, w)
		} else {
			t.Logf("workloadState[%s] = %+v", pod.UID, w)
			return
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("gozt's /config_dump never listed %s/%s as Up: %s", pod.Namespace, pod.Name, last)
}

// readWorkloadState fetches /config_dump from the gozt pod's admin port
// (localhost only in its namespace) through the API server's port-forward.
func readWorkloadState(ctx context.Context, t *testing.T) (workloadState, error) {
	p := goztPod(ctx, t)
	body, err := adminGet(ctx, p.Name, "/config_dump")
	if err != nil {
		return nil, err
	}
	var dump struct {
		WorkloadState workloadState `json:"workloadState"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		return nil, fmt.Errorf("config_dump: %w", err)
	}
	return dump.WorkloadState, nil
}

// goztPod returns the running gozt (ztunnel) pod.
func goztPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	pods, err := cl.cs.CoreV1().Pods(cluster.IstioNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=ztunnel"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			return p
		}
	}
	t.Fatalf("no running ztunnel pod")
	return nil
}

// cniOffKey is a node label istio-cni's DaemonSet is made to require (by
// node affinity) to take it off the node.
const cniOffKey = "gozt-e2e/istio-cni-off"

// testReadyAfterSnapshot takes istio-cni off the node, restarts gozt, and
// checks that gozt's readiness stays "not ready" (pending the workload
// proxy manager) until istio-cni is back and has sent its snapshot.
//
// istio-cni is taken off by node affinity, not by nodeSelector: on shutdown
// its agent (cni/pkg/nodeagent ShouldStopCleanup) treats a DaemonSet that
// still exists as an upgrade and leaves its CNI plugin in the chain unless
// the DaemonSet's node affinity no longer matches the node. A plugin left in
// place holds a kubeconfig whose token was bound to the deleted agent pod, so
// every pod sandbox on the node, gozt's own included, then fails with
// "plugin type=istio-cni failed (add): Unauthorized" until istio-cni returns.
func testReadyAfterSnapshot(ctx context.Context, t *testing.T) {
	ds := cl.cs.AppsV1().DaemonSets(cluster.IstioNamespace)
	setCNIOff := func(off bool) {
		t.Helper()
		affinity := "null"
		if off {
			affinity = fmt.Sprintf(`{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":`+
				`{"nodeSelectorTerms":[{"matchExpressions":[{"key":%q,"operator":"Exists"}]}]}}}`, cniOffKey)
		}
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"affinity":%s}}}}`, affinity)
		if _, err := ds.Patch(ctx, "istio-cni-node", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch istio-cni-node: %v", err)
		}
	}
	setCNIOff(true)
	t.Cleanup(func() { setCNIOff(false) })
	waitNoPods(ctx, t, "k8s-app=istio-cni-node", 2*time.Minute)

	old := goztPod(ctx, t)
	if err := cl.cs.CoreV1().Pods(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete gozt pod: %v", err)
	}
	p := waitNewGoztRunning(ctx, t, old.UID)
	url := fmt.Sprintf("http://%s:15021/healthz/ready", p.Status.PodIP)
	// Without istio-cni there is no snapshot: gozt must say why it is not
	// ready for as long as we look.
	var sawBlocker bool
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		code, body, err := httpGet(ctx, url)
		if err != nil {
			continue // not listening yet
		}
		if code == http.StatusOK {
			t.Fatalf("gozt ready (%s) with no istio-cni on the node", body)
		}
		if strings.Contains(body, "workload proxy manager") {
			sawBlocker = true
		}
	}
	if !sawBlocker {
		t.Errorf("gozt's %s never named the workload proxy manager as pending", url)
	}
	setCNIOff(false)
	waitPodsReady(ctx, t, cluster.IstioNamespace, "k8s-app=istio-cni-node", 2*time.Minute)
	var code int
	var body string
	for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		var err error
		if code, body, err = httpGet(ctx, url); err == nil && code == http.StatusOK {
			break
		}
	}
	if code != http.StatusOK {
		t.Fatalf("gozt not ready 90s after istio-cni came back: %d %s", code, body)
	}
	waitPodsReady(ctx, t, cluster.IstioNamespace, "app=ztunnel", time.Minute)
}

func waitNoPods(ctx context.Context, t *testing.T, sel string, timeout time.Duration) {
	t.Helper()
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(time.Second) {
		pods, err := cl.cs.CoreV1().Pods(cluster.IstioNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil && len(pods.Items) == 0 {
			return
		}
	}
	t.Fatalf("pods %s still there after %v", sel, timeout)
}

// waitNewGoztRunning waits for the gozt pod that replaces the one with
// uid old to have its container running.
func waitNewGoztRunning(ctx context.Context, t *testing.T, old types.UID) *corev1.Pod {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		pods, err := cl.cs.CoreV1().Pods(cluster.IstioNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=ztunnel"})
		if err != nil {
			continue
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID == old || p.Status.PodIP == "" || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			if p.Status.ContainerStatuses[0].State.Running != nil {
				return p
			}
		}
	}
	t.Fatalf("no new gozt pod running after 2m: %s", podEvents(ctx, cluster.IstioNamespace, "app=ztunnel"))
	return nil
}

// podEvents says, for a failure message, the newest event of each pod that
// sel matches: why a sandbox or container did not start.
func podEvents(ctx context.Context, ns, sel string) string {
	pods, err := cl.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "[%s %s", p.Name, p.Status.Phase)
		evs, err := cl.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
		if err == nil && len(evs.Items) > 0 {
			e := slices.MaxFunc(evs.Items, func(x, y corev1.Event) int {
				return x.LastTimestamp.Compare(y.LastTimestamp.Time)
			})
			fmt.Fprintf(&b, ": %s %s", e.Reason, e.Message)
		}
		b.WriteString("] ")
	}
	return b.String()
}

func httpGet(ctx context.Context, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}
