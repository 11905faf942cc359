package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestScenario5 is issue 37's fifth scenario: enrolled pods deleted and
// re-created. gozt drops their workloads (and the listeners it ran in
// their network namespaces), a connection open from a deleted pod ends,
// and gozt's open descriptors and goroutines come back to where they
// were once the churn is over.
func TestScenario5(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s5"
	client, server, _ := meshPair(ctx, t, ns)
	mustDial(ctx, t, client, podAddr(server), "warm-up")

	// The baseline: the pair enrolled and warm, nothing else in flight.
	time.Sleep(3 * time.Second)
	before := goztResources(ctx, t)
	t.Logf("before the churn: %v", before)

	const rounds, perRound = 2, 3
	for round := range rounds {
		names := make([]string, perRound)
		for i := range names {
			names[i] = fmt.Sprintf("churn-%d-%d", round, i)
		}
		pods := createEchoPods(ctx, t, ns, nil, names...)
		for _, name := range names {
			waitWorkloadState(ctx, t, pods[name], 90*time.Second)
			// Traffic both ways: the churn pod as a client and as a server.
			mustDial(ctx, t, pods[name], podAddr(server), "from-"+name)
			mustDial(ctx, t, client, podAddr(pods[name]), "to-"+name)
		}

		t.Logf("round %d, %d churn pods up: %v", round, perRound, goztResources(ctx, t))

		// A connection held open from the first churn pod to the server
		// when that pod goes.
		holder := pods[names[0]]
		heldIn := map[string]string{
			"reporter":                       "destination",
			"source_workload":                names[0],
			"source_workload_namespace":      ns,
			"destination_workload":           "server",
			"destination_workload_namespace": ns,
		}
		opened := metricSum(goztMetrics(ctx, t), connsOpened, heldIn)
		holdCtx, cancelHold := context.WithCancel(ctx)
		held := make(chan echoReply, 1)
		go func() { held <- dialHold(holdCtx, holder, podAddr(server), "held", 2*time.Minute) }()
		// The connection set up through both gozt halves: the server's
		// inbound half has counted it.
		waitMetric(ctx, t, connsOpened, heldIn, opened+1)

		deleted := time.Now()
		for _, name := range names {
			zero := int64(0)
			if err := cl.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatalf("delete pod %s/%s: %v", ns, name, err)
			}
		}
		t.Run(fmt.Sprintf("Round%d/HeldConnectionEnds", round), func(t *testing.T) {
			// Both gozt's halves (outbound in the deleted pod, inbound in
			// the server's) finish, long before the client's 2 min hold.
			for _, dir := range []string{"outbound", "inbound"} {
				// Only lines logged after the delete (the pod's earlier,
				// short dials to the server ended seconds before it).
				l := waitLogLine(ctx, t, deleted, "connection complete", logField("direction", dir),
					"src.addr="+holder.Status.PodIP+":", "dst.hbone_addr="+podAddr(server))
				t.Logf("%.1fs after the delete, gozt: %s", time.Since(deleted).Seconds(), l)
			}
		})
		cancelHold()
		<-held
		t.Run(fmt.Sprintf("Round%d/WorkloadsGo", round), func(t *testing.T) {
			for _, name := range names {
				waitWorkloadGone(ctx, t, pods[name], 90*time.Second)
			}
		})
	}

	t.Run("DescriptorsAndGoroutinesReturn", func(t *testing.T) {
		// Slack for what comes and goes on its own: xDS and CA streams,
		// the admin connection of the port-forward, pooled HBONE
		// connections to the server pod.
		const fdSlack, goroutineSlack = 8, 20
		var after goztUsage
		for end := time.Now().Add(90 * time.Second); time.Now().Before(end); time.Sleep(3 * time.Second) {
			after = goztResources(ctx, t)
			if after.FDs <= before.FDs+fdSlack && after.Goroutines <= before.Goroutines+goroutineSlack {
				break
			}
		}
		t.Logf("before: %v; after %d rounds of %d pods: %v", before, rounds, perRound, after)
		if after.PID != before.PID {
			t.Fatalf("gozt restarted during the churn: pid %d, then %d", before.PID, after.PID)
		}
		if after.FDs > before.FDs+fdSlack {
			t.Errorf("gozt holds %d descriptors after the churn, %d before (slack %d):\n%s",
				after.FDs, before.FDs, fdSlack, after.fdList)
		}
		if after.Goroutines > before.Goroutines+goroutineSlack {
			t.Errorf("gozt runs %d goroutines after the churn, %d before (slack %d):\n%s",
				after.Goroutines, before.Goroutines, goroutineSlack, tail(after.goroutineDump, 200))
		}
	})
}

// waitWorkloadGone waits until gozt's /config_dump no longer lists pod.
func waitWorkloadGone(ctx context.Context, t *testing.T, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	var last string
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(2 * time.Second) {
		ws, err := readWorkloadState(ctx, t)
		if err != nil {
			last = err.Error()
			continue
		}
		w, ok := ws[string(pod.UID)]
		if !ok {
			return
		}
		last = fmt.Sprintf("workloadState[%s] = %+v", pod.UID, w)
	}
	t.Fatalf("gozt's /config_dump still lists deleted pod %s/%s: %s", pod.Namespace, pod.Name, last)
}

// goztUsage is what the gozt process holds at one moment.
type goztUsage struct {
	PID, FDs, Goroutines int

	fdList, goroutineDump string
}

func (u goztUsage) String() string {
	return fmt.Sprintf("pid %d: %d open descriptors, %d goroutines", u.PID, u.FDs, u.Goroutines)
}

// goztResources reads the gozt process's open descriptors from /proc (the
// node's processes are this machine's) and its goroutines from
// /debug/pprof/goroutine on the admin port.
func goztResources(ctx context.Context, t *testing.T) goztUsage {
	t.Helper()
	p := goztPod(ctx, t)
	pid := goztPID(t, string(p.UID))
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("gozt's descriptors: %v", err)
	}
	u := goztUsage{PID: pid, FDs: len(ents)}
	var list strings.Builder
	for _, e := range ents {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		fmt.Fprintf(&list, "  %s -> %s\n", e.Name(), target)
	}
	u.fdList = list.String()
	body, err := adminGet(ctx, p.Name, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatalf("gozt's goroutines: %v", err)
	}
	u.goroutineDump = string(body)
	first, _, _ := strings.Cut(u.goroutineDump, "\n")
	n, ok := strings.CutPrefix(first, "goroutine profile: total ")
	if !ok {
		t.Fatalf("gozt's goroutine profile starts %q", first)
	}
	if u.Goroutines, err = strconv.Atoi(strings.TrimSpace(n)); err != nil {
		t.Fatalf("gozt's goroutine profile starts %q", first)
	}
	return u
}

// goztPID finds the host PID of the gozt process of the pod with uid
// podUID: the process whose cgroup is that pod's and whose command is
// gozt's entrypoint.
func goztPID(t *testing.T, podUID string) int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var found []int
	for _, d := range dirs {
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmd), "\x00")
		if filepath.Base(argv0) != "gozt" && filepath.Base(argv0) != "ztunnel" {
			continue
		}
		if !inPodCgroup(d+"/cgroup", podUID) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		found = append(found, pid)
	}
	if len(found) != 1 {
		t.Fatalf("want one gozt process in pod %s's cgroup, found %v", podUID, found)
	}
	return found[0]
}

func inPodCgroup(path, podUID string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	// cgroupfs names a pod's cgroup pod<uid>; the systemd driver would
	// write the uid's dashes as underscores.
	want := []string{"pod" + podUID, "pod" + strings.ReplaceAll(podUID, "-", "_")}
	for sc.Scan() {
		for _, w := range want {
			if strings.Contains(sc.Text(), w) {
				return true
			}
		}
	}
	return false
}
