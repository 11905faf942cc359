package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var serviceEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}

// TestScenario9 is issue 37's ninth scenario: DNS capture, which Istio's
// istio-cni chart turns on by default (ambient.dnsCapture). An enrolled
// pod's own resolver queries (UDP to its resolv.conf server, port 53) are
// redirected to gozt's DNS proxy in the pod's network namespace: gozt
// answers a Service's name itself, and a ServiceEntry's host, which no
// other DNS server knows, with the address istiod allocated to it, and the
// pod connects to that name through the mesh; and a pod's name under a
// headless Service. A pod outside the mesh is
// not captured: the ServiceEntry's host does not resolve for it.
func TestScenario9(t *testing.T) {
	ctx := context.Background()
	const ns, plain = "e2e-s9", "e2e-s9-plain"
	client, server, svcIP := meshPair(ctx, t, ns)
	createNamespace(ctx, t, plain, false)
	outside := createEchoPods(ctx, t, plain, nil, "outside")["outside"]

	t.Run("ServiceNameAnsweredByGozt", func(t *testing.T) {
		counted := map[string]string{"source_canonical_service": "client", "request_query_type": "a"} // lowercase, as ztunnel's
		body := goztMetrics(ctx, t)
		before := metricSum(body, "istio_dns_requests_total", counted)
		upstream := metricSum(body, "istio_dns_upstream_requests_total", counted)
		name := "server." + ns + ".svc.cluster.local"
		addrs := waitLookup(ctx, t, client, name, func(a []string) bool { return len(a) > 0 })
		if len(addrs) != 1 || addrs[0] != svcIP {
			t.Errorf("%s resolves to %v in the client pod, want the Service's ClusterIP %s", name, addrs, svcIP)
		}
		waitMetric(ctx, t, "istio_dns_requests_total", counted, before+1)
		if after := metricSum(goztMetrics(ctx, t), "istio_dns_upstream_requests_total", counted); after != upstream {
			t.Errorf("gozt forwarded the client's A query upstream (%v -> %v) instead of answering it from xDS", upstream, after)
		}
	})

	t.Run("HeadlessServicePodName", func(t *testing.T) {
		// A headless Service in front of the server pod: gozt answers the
		// pod's own name under it (istiod sends no pod hostname, so the
		// pod's name stands for it, as in ztunnel's #1918).
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "server-hl"},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": "server"},
				Ports: []corev1.ServicePort{{Name: "tcp-echo", Port: echoPort}},
			},
		}
		if _, err := cl.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create headless service: %v", err)
		}
		name := server.Name + ".server-hl." + ns + ".svc.cluster.local"
		addrs := waitLookup(ctx, t, client, name, func(a []string) bool { return len(a) > 0 })
		if len(addrs) != 1 || addrs[0] != server.Status.PodIP {
			t.Errorf("%s resolves to %v in the client pod, want the server pod's IP %s", name, addrs, server.Status.PodIP)
		}
		r := mustDial(ctx, t, client, net.JoinHostPort(server.Name+".server-hl", fmt.Sprint(echoPort)), "hello-headless")
		checkSourcePreserved(t, r, client)
	})

	dyn, err := dynamic.NewForConfig(cl.rc)
	if err != nil {
		t.Fatal(err)
	}
	const host = "echo.gozt-e2e.example"
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "ServiceEntry",
		"metadata":   map[string]any{"name": "echo", "namespace": ns},
		"spec": map[string]any{
			"hosts":            []any{host},
			"location":         "MESH_INTERNAL",
			"resolution":       "STATIC",
			"ports":            []any{map[string]any{"number": int64(80), "name": "tcp-echo", "protocol": "TCP", "targetPort": int64(echoPort)}},
			"workloadSelector": map[string]any{"labels": map[string]any{"app": "server"}},
		},
	}}
	if _, err := dyn.Resource(serviceEntries).Namespace(ns).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceEntry: %v", err)
	}

	t.Run("ServiceEntryHostResolvesAndConnects", func(t *testing.T) {
		addrs := waitLookup(ctx, t, client, host, func(a []string) bool { return len(a) > 0 })
		for _, a := range addrs {
			if _, err := netip.ParseAddr(a); err != nil {
				t.Errorf("%s resolves to %q: %v", host, a, err)
			}
		}
		t.Logf("%s -> %v (allocated by istiod, answered by gozt)", host, addrs)
		r := mustDial(ctx, t, client, net.JoinHostPort(host, "80"), "hello-service-entry")
		checkSourcePreserved(t, r, client)
	})

	t.Run("NotCapturedOutsideTheMesh", func(t *testing.T) {
		out, errOut, err := execIn(ctx, outside, "/echo", "lookup", host)
		if err == nil {
			t.Errorf("%s resolves in a pod outside the mesh (%s): its DNS was captured, or another server knows the name", host, out)
		}
		t.Logf("outside the mesh: %v %s", err, strings.TrimSpace(out+errOut))
	})
}

// waitLookup runs `echo lookup name` in pod until done accepts the
// addresses (a minute at most: istiod pushes a new name to gozt within
// seconds) and returns them.
func waitLookup(ctx context.Context, t *testing.T, pod *corev1.Pod, name string, done func([]string) bool) []string {
	t.Helper()
	var last string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		out, errOut, err := execIn(ctx, pod, "/echo", "lookup", name)
		if a, ok := strings.CutPrefix(strings.TrimSpace(out), "addrs="); ok && err == nil {
			if addrs := strings.Split(a, ","); done(addrs) {
				return addrs
			}
		}
		last = strings.TrimSpace(out + errOut)
	}
	t.Fatalf("lookup %s in %s/%s: %s", name, pod.Namespace, pod.Name, last)
	return nil
}
