package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// Helpers for the scenarios that run the echo app in pods and drive
// traffic between them.

// echoPort is the port every echo pod serves on.
const echoPort = 8080

// createNamespace creates ns, labelled for ambient when ambient is set,
// and deletes it when the test ends. A namespace of the same name still
// terminating from an earlier run (make e2e-up, run by hand) is waited out.
func createNamespace(ctx context.Context, t *testing.T, ns string, ambient bool) {
	t.Helper()
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if ambient {
		obj.Labels = map[string]string{"istio.io/dataplane-mode": "ambient"}
	}
	var err error
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		if _, err = cl.cs.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
			break
		}
	}
	if err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		cl.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	waitServiceAccount(ctx, t, ns, "default")
}

// createServiceAccount creates the service account name in ns.
func createServiceAccount(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cl.cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account %s/%s: %v", ns, name, err)
	}
}

// createEchoPods creates one echo pod per name (labelled app=<name>, run
// as the service account sa[name], "default" when absent), all at once,
// and waits until they are Ready. In an ambient namespace it also checks
// that istio-cni enrolled each one.
func createEchoPods(ctx context.Context, t *testing.T, ns string, sa map[string]string, names ...string) map[string]*corev1.Pod {
	t.Helper()
	for _, name := range names {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa[name],
				Containers: []corev1.Container{{
					Name: "echo", Image: cluster.EchoImage, ImagePullPolicy: corev1.PullNever,
					Args:  []string{"serve", "-addr", fmt.Sprintf(":%d", echoPort)},
					Ports: []corev1.ContainerPort{{ContainerPort: echoPort}},
				}},
				TerminationGracePeriodSeconds: new(int64),
			},
		}
		if _, err := cl.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s/%s: %v", ns, name, err)
		}
	}
	nsObj, err := cl.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ambient := nsObj.Labels["istio.io/dataplane-mode"] == "ambient"
	out := map[string]*corev1.Pod{}
	for _, name := range names {
		pods := waitPodsReady(ctx, t, ns, "app="+name, 2*time.Minute)
		p := &pods[0]
		got := p.Annotations["ambient.istio.io/redirection"]
		if ambient && got != "enabled" {
			t.Fatalf("pod %s/%s: ambient.istio.io/redirection = %q, want enabled (istio-cni did not enrol it)", ns, name, got)
		}
		if !ambient && got != "" {
			t.Fatalf("pod %s/%s of a namespace outside the mesh: ambient.istio.io/redirection = %q", ns, name, got)
		}
		out[name] = p
	}
	return out
}

// createEchoService creates the Service name in ns, port port, in front
// of the echo pods labelled app=<name>, and returns its ClusterIP.
func createEchoService(ctx context.Context, t *testing.T, ns, name string, port int32) string {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "tcp-echo", Port: port, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
	got, err := cl.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
	return got.Spec.ClusterIP
}

// meshPair creates the ambient namespace ns with the service accounts
// client and server, an echo pod of each (named after it), and the Service
// server on port 80 in front of the server pod; it returns the two pods and
// the Service's ClusterIP.
func meshPair(ctx context.Context, t *testing.T, ns string) (client, server *corev1.Pod, svcIP string) {
	t.Helper()
	createNamespace(ctx, t, ns, true)
	createServiceAccount(ctx, t, ns, "client")
	createServiceAccount(ctx, t, ns, "server")
	pods := createEchoPods(ctx, t, ns, map[string]string{"client": "client", "server": "server"}, "client", "server")
	return pods["client"], pods["server"], createEchoService(ctx, t, ns, "server", 80)
}

// execIn runs cmd in the first container of pod through the API server and
// returns its stdout and stderr; err is non-nil when it could not run or
// exited non-zero.
func execIn(ctx context.Context, pod *corev1.Pod, cmd ...string) (string, string, error) {
	req := cl.cs.CoreV1().RESTClient().Post().Resource("pods").
		Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: pod.Spec.Containers[0].Name, Command: cmd, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cl.rc, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	return stdout.String(), stderr.String(), err
}

// echoReply is what `echo dial` printed: the peer address the server saw
// and the bytes it echoed back.
type echoReply struct {
	Peer   string // "IP:PORT", "" when no peer= line came back
	Echoed string
	Raw    string // stdout and stderr, for messages
	Err    error  // the exec's error (a non-zero exit among them)
}

// PeerIP is the IP of the peer= line, "" without one.
func (r echoReply) PeerIP() string {
	host, _, err := net.SplitHostPort(r.Peer)
	if err != nil {
		return ""
	}
	return host
}

// OK says the connection carried msg to the server and back.
func (r echoReply) OK(msg string) bool { return r.Peer != "" && r.Echoed == msg }

func (r echoReply) String() string {
	return fmt.Sprintf("peer=%q echoed=%q err=%v output=%q", r.Peer, r.Echoed, r.Err, r.Raw)
}

// dialFrom runs `echo dial addr msg` in pod and parses what came back.
func dialFrom(ctx context.Context, pod *corev1.Pod, addr, msg string) echoReply {
	return dialHold(ctx, pod, addr, msg, 0)
}

// dialHold is dialFrom with the connection held open for hold before the
// client half-closes.
func dialHold(ctx context.Context, pod *corev1.Pod, addr, msg string, hold time.Duration) echoReply {
	ctx, cancel := context.WithTimeout(ctx, hold+30*time.Second)
	defer cancel()
	stdout, stderr, err := execIn(ctx, pod, "/echo", "dial", "-hold", hold.String(), addr, msg)
	r := echoReply{Raw: stdout + stderr, Err: err}
	first, rest, _ := strings.Cut(stdout, "\n")
	if p, ok := strings.CutPrefix(first, "peer="); ok {
		r.Peer, r.Echoed = p, rest
	} else {
		r.Echoed = stdout
	}
	return r
}

// mustDial dials addr from pod with msg and fails the test unless msg came
// back; it retries for a while, as a freshly created pod or Service may
// not have reached gozt (through istiod) yet.
func mustDial(ctx context.Context, t *testing.T, pod *corev1.Pod, addr, msg string) echoReply {
	t.Helper()
	var r echoReply
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if r = dialFrom(ctx, pod, addr, msg); r.OK(msg) {
			return r
		}
		t.Logf("dial %s from %s/%s: %v (retrying)", addr, pod.Namespace, pod.Name, r)
	}
	t.Fatalf("dial %s from %s/%s never echoed %q: %v", addr, pod.Namespace, pod.Name, msg, r)
	return r
}

// podAddr is pod's IP and the echo port, as a dial address.
func podAddr(p *corev1.Pod) string {
	return net.JoinHostPort(p.Status.PodIP, fmt.Sprint(echoPort))
}

// spiffeID is the SPIFFE identity Istio gives the service account sa of ns.
func spiffeID(ns, sa string) string {
	return fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", ns, sa)
}

// goztMetrics fetches gozt's Prometheus metrics from its pod's port 15020
// (which the chart exposes on the pod IP, reachable from the node).
func goztMetrics(ctx context.Context, t *testing.T) string {
	t.Helper()
	p := goztPod(ctx, t)
	code, body, err := httpGet(ctx, fmt.Sprintf("http://%s/metrics", net.JoinHostPort(p.Status.PodIP, "15020")))
	if err != nil || code != 200 {
		t.Fatalf("gozt /metrics: %d %v", code, err)
	}
	return body
}

// metricSeries returns the series of metric name in a Prometheus text
// exposition whose labels include every label of want, with their values.
func metricSeries(body, name string, want map[string]string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		match := true
		for k, v := range want {
			if !strings.Contains(","+labels+",", fmt.Sprintf(",%s=%q,", k, v)) {
				match = false
				break
			}
		}
		if match {
			out[labels] = value
		}
	}
	return out
}

// metricSum is the sum of the series of name whose labels include want.
func metricSum(body, name string, want map[string]string) float64 {
	var sum float64
	for _, v := range metricSeries(body, name, want) {
		var f float64
		fmt.Sscan(v, &f)
		sum += f
	}
	return sum
}

// waitMetric waits until the series of name in gozt's /metrics whose
// labels include want sum to at least atLeast, and logs them.
func waitMetric(ctx context.Context, t *testing.T, name string, want map[string]string, atLeast float64) {
	t.Helper()
	var body string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		body = goztMetrics(ctx, t)
		if metricSum(body, name, want) >= atLeast {
			for labels, v := range metricSeries(body, name, want) {
				t.Logf("%s{%s} %s", name, labels, v)
			}
			return
		}
	}
	var related []string
	for labels, v := range metricSeries(body, name, nil) {
		related = append(related, fmt.Sprintf("  %s{%s} %s", name, labels, v))
	}
	t.Fatalf("gozt's /metrics: %s with %v sums to %v, want at least %v; its %s series:\n%s",
		name, want, metricSum(body, name, want), atLeast, name, strings.Join(related, "\n"))
}

// goztLogs returns the running gozt pod's log since since.
func goztLogs(ctx context.Context, t *testing.T, since time.Time) string {
	t.Helper()
	p := goztPod(ctx, t)
	st := metav1.NewTime(since.Add(-time.Second))
	b, err := cl.cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{SinceTime: &st}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("gozt's log: %v", err)
	}
	return string(b)
}

// waitLogLine waits until a line of gozt's log since since contains every
// string of want, and returns it.
func waitLogLine(ctx context.Context, t *testing.T, since time.Time, want ...string) string {
	t.Helper()
	var logs string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		logs = goztLogs(ctx, t, since)
	line:
		for l := range strings.Lines(logs) {
			for _, w := range want {
				if !strings.Contains(l, w) {
					continue line
				}
			}
			return strings.TrimSpace(l)
		}
	}
	t.Fatalf("gozt's log has no line with all of %q; since %v it logged:\n%s", want, since.Format(time.RFC3339), tail(logs, 40))
	return ""
}

// logField is key="value" as gozt's log writes a string field.
func logField(key, value string) string { return fmt.Sprintf("%s=%q", key, value) }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
