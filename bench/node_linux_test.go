package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gozt/gozt/internal/workers"
)

// TestNodeScenario runs the node scenario on a tiny budget, 4 pods: the
// gozt binary (built from cmd/gozt) and the bare program each take the pods
// over ZDS in the node's namespace, gozt is killed and restarted under
// clients, sampled with no pod and with all, and carries traffic through
// every pod's SOCKS5 port and HBONE. Every row must have a figure, nothing
// may be left running, and no namespace or socket may outlive it. It
// asserts no speed.
func TestNodeScenario(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("builds gozt and starts child processes")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction(workers.IdleTop))
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts, err := parseOptions([]string{"--quick", "--net", "127.58", "--out", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	e, err := newEnv(ctx, opts, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	e.b = budget{reps: 1, dur: 100 * time.Millisecond, warmDur: 50 * time.Millisecond, rtts: 40, workers: 2,
		nodePods: 4, nodeIdle: 200 * time.Millisecond, nodeProbe: 20 * time.Millisecond,
		quietWindow: 10 * time.Millisecond, quietCap: 10 * time.Millisecond}
	e.scen = "node"
	rs, err := runNode(ctx, e)
	e.close()
	if err != nil {
		t.Fatalf("runNode: %v\nstderr:\n%s", err, stderr.String())
	}
	if kids := children(); len(kids) > 0 {
		t.Errorf("child processes left running: %v", kids)
	}
	if len(e.notes) > 0 {
		t.Errorf("notes %q, want none", e.notes)
	}
	if len(rs) != 22 {
		t.Errorf("%d results, want 22", len(rs))
	}
	for _, r := range rs {
		if r.Scenario != nodeTitle || r.Samples != 1 {
			t.Errorf("result %q: scenario %q, %d samples; want %q, 1", r.Metric, r.Scenario, r.Samples, nodeTitle)
		}
		if strings.Contains(r.Note, "failed") {
			t.Errorf("result %q: %s", r.Metric, r.Note)
		}
		// Refused connections and idle CPU may be zero; nothing is
		// negative, and every baseline but idle CPU's is positive.
		if r.Value < 0 || r.BaselineValue < 0 || (r.Baseline != "" && r.Baseline != "no pod" && r.BaselineValue <= 0) {
			t.Errorf("result %q: value %v, baseline %q %v", r.Metric, r.Value, r.Baseline, r.BaselineValue)
		}
	}
	for _, metric := range []string{"ZDS add → ack p99, one pod at a time", "memory per idle pod (RSS)", "descriptors per idle pod"} {
		if r := findResult(rs, metric); r == nil || r.Value <= 0 {
			t.Errorf("result %q = %+v, want a positive figure", metric, r)
		}
	}
}

// findResult returns the result whose metric is metric, or nil.
func findResult(rs []Result, metric string) *Result {
	for i := range rs {
		if rs[i].Metric == metric {
			return &rs[i]
		}
	}
	return nil
}
