package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// TestScenario6 is issue 37's sixth scenario: a roll of the gozt DaemonSet
// to a second tag of the same image (cluster.RollImage), which Kubernetes
// carries out with the chart's maxSurge 1 / maxUnavailable 0: the new gozt takes every pod over
// from istio-cni before the old one is told to stop). A connection opened
// before the roll half-closes while the old gozt drains and still gets its
// echo and EOF back through it, and a client opening a connection every
// 50 ms all through the roll sees no failed connection.
//
// Both clients run in an enrolled client pod against an enrolled server
// pod of another service account: HBONE through gozt's outbound in the
// client's namespace and its inbound in the server's, the listeners the old
// and the new gozt share there. The 50 ms client is one process
// (`echo dial -every 50ms -for D`), started by one exec.
func TestScenario6(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s6"
	client, server, _ := meshPair(ctx, t, ns)
	addr := podAddr(server)
	mustDial(ctx, t, client, addr, "warm-up")
	old := goztPod(ctx, t)

	const probeFor, every = 45 * time.Second, 50 * time.Millisecond
	probeDone := make(chan echoLoop, 1)
	go func() { probeDone <- dialEvery(ctx, client, addr, "roll", every, probeFor) }()
	time.Sleep(time.Second)

	// The long connection: opened before the roll, it half-closes hold
	// later, while the old gozt drains, and its echo and EOF must come back.
	const hold = 15 * time.Second
	heldAt := time.Now()
	heldDone := make(chan echoReply, 1)
	go func() { heldDone <- dialHold(ctx, client, addr, "held-through-the-roll", hold) }()
	time.Sleep(2 * time.Second)

	// The roll moves the DaemonSet to the second tag of gozt's image (and
	// back, on a cluster already rolled by an earlier run).
	image := old.Spec.Containers[0].Image
	next, ok := strings.CutSuffix(image, "-roll")
	if !ok {
		next = cluster.RollImage(image)
	}
	rollAt := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, old.Spec.Containers[0].Name, next)
	if _, err := cl.cs.AppsV1().DaemonSets(cluster.IstioNamespace).Patch(ctx, "ztunnel", types.StrategicMergePatchType,
		[]byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch the ztunnel DaemonSet: %v", err)
	}
	deletedAt := waitPodDeleting(ctx, t, old)
	goneAt := waitPodGone(ctx, t, old, 2*time.Minute)
	held := <-heldDone
	newPod := waitPodsReady(ctx, t, cluster.IstioNamespace, "app=ztunnel", 2*time.Minute)[0]
	probe := <-probeDone
	t.Logf("roll: old gozt %s (%s) terminating %.1fs after the patch, gone %.1fs after that; new gozt %s (%s)",
		old.Name, image, deletedAt.Sub(rollAt).Seconds(), goneAt.Sub(deletedAt).Seconds(), newPod.Name, newPod.Spec.Containers[0].Image)
	if got := newPod.Spec.Containers[0].Image; got != next {
		t.Errorf("the new gozt pod runs %s, want %s", got, next)
	}

	t.Run("HeldConnectionCarriesBytesThroughTheDrain", func(t *testing.T) {
		halfClosed := heldAt.Add(hold)
		t.Logf("held connection: opened %.1fs before the old gozt began terminating, half-closed %.1fs into its drain: %v",
			deletedAt.Sub(heldAt).Seconds(), halfClosed.Sub(deletedAt).Seconds(), held)
		if !held.OK("held-through-the-roll") || held.Err != nil {
			t.Errorf("the connection opened before the roll did not echo and end cleanly after it: %v", held)
		}
		if !deletedAt.Before(halfClosed) || !goneAt.After(halfClosed) {
			t.Errorf("the held connection half-closed at %s, outside the old gozt's drain (%s to %s): the test's timing is off",
				halfClosed.Format(time.StampMilli), deletedAt.Format(time.StampMilli), goneAt.Format(time.StampMilli))
		}
	})
	t.Run("NoFailedConnectionDuringTheRoll", func(t *testing.T) {
		t.Logf("a connection every %v for %v across the roll (old %s -> new %s): %d echoed, %d failed",
			every, probeFor, old.Name, newPod.Name, probe.ok, probe.failed)
		if probe.err != nil && probe.failed == 0 {
			t.Fatalf("the 50 ms client did not run: %v: %s", probe.err, probe.raw)
		}
		if want := int(probeFor/every) * 9 / 10; probe.ok < want {
			t.Errorf("only %d connections echoed, want at least %d: the client did not run through the roll", probe.ok, want)
		}
		if probe.failed > 0 {
			t.Errorf("%d connections failed during the roll:\n%s", probe.failed, probe.raw)
		}
	})
}

// echoLoop is what `echo dial -every` printed.
type echoLoop struct {
	ok, failed int
	raw        string // its whole output
	err        error  // the exec's
}

// dialEvery runs `echo dial -every every -for dur addr msg` in pod.
func dialEvery(ctx context.Context, pod *corev1.Pod, addr, msg string, every, dur time.Duration) echoLoop {
	ctx, cancel := context.WithTimeout(ctx, dur+time.Minute)
	defer cancel()
	stdout, stderr, err := execIn(ctx, pod, "/echo", "dial", "-every", every.String(), "-for", dur.String(), addr, msg)
	r := echoLoop{raw: stdout + stderr, err: err}
	first, _, _ := strings.Cut(stdout, "\n")
	if _, serr := fmt.Sscanf(first, "ok=%d failed=%d", &r.ok, &r.failed); serr != nil && err == nil {
		r.err = fmt.Errorf("summary line %q: %w", first, serr)
	}
	return r
}

// waitPodDeleting waits until pod is marked for deletion (or gone) and
// returns when it saw that.
func waitPodDeleting(ctx context.Context, t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		p, err := cl.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID || p.DeletionTimestamp != nil {
			return time.Now()
		}
	}
	t.Fatalf("pod %s/%s never began terminating", pod.Namespace, pod.Name)
	return time.Time{}
}

// waitPodGone waits until pod no longer exists and returns when it saw
// that.
func waitPodGone(ctx context.Context, t *testing.T, pod *corev1.Pod, timeout time.Duration) time.Time {
	t.Helper()
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		p, err := cl.cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID {
			return time.Now()
		}
	}
	t.Fatalf("pod %s/%s still there after %v", pod.Namespace, pod.Name, timeout)
	return time.Time{}
}
