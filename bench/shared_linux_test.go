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

// requireRoot skips t, or fails it when GOZT_REQUIRE_ROOT=1 (CI), unless
// this process may start children in network namespaces of their own.
func requireRoot(t *testing.T) {
	t.Helper()
	err := netnsUnavailable()
	if err == nil {
		return
	}
	const why = "ROOT-ONLY NAMESPACE TEST %s: %v"
	if os.Getenv("GOZT_REQUIRE_ROOT") == "1" {
		t.Fatalf("FAILING "+why+" and GOZT_REQUIRE_ROOT=1", t.Name(), err)
	}
	t.Skipf("SKIPPING "+why+"; GOZT_REQUIRE_ROOT=1 makes this a failure", t.Name(), err)
}

// TestSharedScenario runs the shared-mode scenario on a tiny budget: the
// dedicated pair and the shared pair (each gozt in a network namespace of
// its own, its sockets made in the harness's) in child processes, every
// row with a positive figure and its dedicated-mode baseline, and nothing
// left running. It asserts no speed.
func TestSharedScenario(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("starts child processes")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction(workers.IdleTop))
	// Race-enabled children otherwise sleep 1 s at exit, and this test
	// stops a dozen of them one after another.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A /16 of its own, apart from TestRunQuickEndToEnd's and a bench run's.
	opts, err := parseOptions([]string{"--quick", "--net", "127.57", "--out", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	e, err := newEnv(ctx, opts, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	e.b = budget{reps: 1, dur: 100 * time.Millisecond, warmDur: 50 * time.Millisecond, workers: 2, idleConns: 50,
		quietWindow: 10 * time.Millisecond, quietCap: 10 * time.Millisecond}
	e.scen = "shared"
	rs, err := runShared(ctx, e)
	e.close()
	if err != nil {
		t.Fatalf("runShared: %v\nstderr:\n%s", err, stderr.String())
	}
	if kids := children(); len(kids) > 0 {
		t.Errorf("child processes left running: %v", kids)
	}
	if len(e.notes) > 0 {
		t.Errorf("notes %q, want none", e.notes)
	}
	if len(rs) != 7 {
		t.Fatalf("%d results, want 7: %+v", len(rs), rs)
	}
	for _, r := range rs {
		if r.Scenario != sharedTitle || r.Baseline != "dedicated mode" || r.Samples != 1 {
			t.Errorf("result %+v: want scenario %q against \"dedicated mode\", 1 sample", r, sharedTitle)
		}
		if r.Value <= 0 || r.BaselineValue <= 0 || r.Ratio <= 0 {
			t.Errorf("result %s: value %v, baseline %v, ratio %v; want positive figures", r.Metric, r.Value, r.BaselineValue, r.Ratio)
		}
	}
}
