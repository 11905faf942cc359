package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var authzPolicies = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}

// TestScenario4 is issue 37's fourth scenario: an AuthorizationPolicy
// created through the API server that ALLOWs only the client's service
// account on the server refuses a pod of another service account and lets
// the client through; deleted, it lets both through again. It logs how
// long istiod and gozt take to enforce the policy, and to lift it.
func TestScenario4(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s4"
	createNamespace(ctx, t, ns, true)
	sas := map[string]string{"client": "client", "other": "other", "server": "server"}
	for _, sa := range sas {
		createServiceAccount(ctx, t, ns, sa)
	}
	pods := createEchoPods(ctx, t, ns, sas, "client", "other", "server")
	client, other, server := pods["client"], pods["other"], pods["server"]
	addr := podAddr(server)
	dyn, err := dynamic.NewForConfig(cl.rc)
	if err != nil {
		t.Fatal(err)
	}
	aps := dyn.Resource(authzPolicies).Namespace(ns)

	t.Run("BothPassWithoutPolicy", func(t *testing.T) {
		mustDial(ctx, t, client, addr, "hello-client")
		mustDial(ctx, t, other, addr, "hello-other")
	})
	if t.Failed() {
		return
	}

	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "security.istio.io/v1",
		"kind":       "AuthorizationPolicy",
		"metadata":   map[string]any{"name": "allow-client", "namespace": ns},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "server"}},
			"action":   "ALLOW",
			"rules": []any{map[string]any{
				"from": []any{map[string]any{"source": map[string]any{
					"principals": []any{"cluster.local/ns/" + ns + "/sa/client"},
				}}},
			}},
		},
	}}
	t.Cleanup(func() { aps.Delete(context.Background(), "allow-client", metav1.DeleteOptions{}) })
	t.Run("AllowOnlyClient", func(t *testing.T) {
		created := time.Now()
		if _, err := aps.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create AuthorizationPolicy: %v", err)
		}
		r, took := pollUntil(ctx, t, other, addr, "hello-other", created, refused)
		t.Logf("policy enforced %v after the create call (other's first refused dial: %v)", took.Round(time.Millisecond), r)
		since := time.Now()
		// Enforced, it stays enforced: the other pod is refused every time.
		for i := 0; i < 5; i++ {
			if r := dialFrom(ctx, other, addr, "hello-other"); !refused(r, "hello-other") {
				t.Errorf("dial %d from %s/other (sa other) after enforcement passed: %v", i, ns, r)
			}
		}
		r = dialFrom(ctx, client, addr, "hello-client")
		if !r.OK("hello-client") {
			t.Errorf("the client (sa client), which the policy allows, was refused: %v", r)
		}
		checkSourcePreserved(t, r, client)
		l := waitLogLine(ctx, t, since, logField("src.identity", spiffeID(ns, "other")),
			logField("dst.identity", spiffeID(ns, "server")), logField("direction", "inbound"), "connection denied by authorization policy")
		t.Logf("gozt: %s", l)
	})
	if t.Failed() {
		return
	}
	t.Run("PassesAgainAfterDelete", func(t *testing.T) {
		deleted := time.Now()
		if err := aps.Delete(ctx, "allow-client", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete AuthorizationPolicy: %v", err)
		}
		r, took := pollUntil(ctx, t, other, addr, "hello-other", deleted, func(r echoReply, msg string) bool { return r.OK(msg) })
		t.Logf("policy lifted %v after the delete call (other's first echoed dial: %v)", took.Round(time.Millisecond), r)
		checkSourcePreserved(t, r, other)
		mustDial(ctx, t, client, addr, "hello-client")
	})
}

// refused says a dial was refused as ztunnel refuses: `echo dial` ran and
// failed (the connection reset or closed) without the server's peer= line
// or the echo. A failed exec is not a refusal.
func refused(r echoReply, msg string) bool {
	ran := r.Err != nil && strings.Contains(r.Err.Error(), "exit code") && strings.HasPrefix(r.Raw, "echo: ")
	return ran && r.Peer == "" && !strings.Contains(r.Raw, msg)
}

// pollUntil dials addr from pod every 100 ms until done says the reply is
// the one awaited, for at most a minute, and returns that reply and the
// time from t0 to the end of its dial.
func pollUntil(ctx context.Context, t *testing.T, pod *corev1.Pod, addr, msg string, t0 time.Time, done func(echoReply, string) bool) (echoReply, time.Duration) {
	t.Helper()
	var r echoReply
	n := 0
	for time.Since(t0) < time.Minute {
		n++
		r = dialFrom(ctx, pod, addr, msg)
		if done(r, msg) {
			return r, time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("dial %s from %s/%s: not yet after %d dials in %v; last: %v", addr, pod.Namespace, pod.Name, n, time.Since(t0), r)
	return r, 0
}
