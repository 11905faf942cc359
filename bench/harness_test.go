package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// tcpPair returns the two ends of a loopback TCP connection (net.Pipe has
// no buffer, and a pipelined handshake needs one).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestSOCKS(t *testing.T) {
	a, b := tcpPair(t)
	dst := netip.MustParseAddrPort("127.55.0.3:9000")
	got := make(chan netip.AddrPort, 1)
	go func() {
		d, err := socksAccept(b)
		if err != nil {
			t.Errorf("socksAccept: %v", err)
		}
		got <- d
		// The first application bytes, sent with the handshake, follow.
		var first [2]byte
		io.ReadFull(b, first[:])
		b.Write(first[:])
	}()
	if err := socksHandshake(a, dst, []byte("Ex")); err != nil {
		t.Fatalf("socksHandshake: %v", err)
	}
	if d := <-got; d != dst {
		t.Errorf("server saw destination %v, want %v", d, dst)
	}
	var echo [2]byte
	if _, err := io.ReadFull(a, echo[:]); err != nil || string(echo[:]) != "Ex" {
		t.Errorf("pipelined payload = %q, %v; want \"Ex\"", echo, err)
	}
}

func TestSOCKSRefused(t *testing.T) {
	a, b := tcpPair(t)
	go func() {
		io.ReadFull(b, make([]byte, 3+10))
		b.Write([]byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}) // host unreachable
	}()
	if err := socksHandshake(a, netip.MustParseAddrPort("10.0.0.1:80"), nil); err == nil {
		t.Fatal("socksHandshake accepted a failure reply")
	}
}

func TestSplitCommonFlags(t *testing.T) {
	got := splitCommonFlags([]string{"--config", "f", "--gomaxprocs", "1", "--uids=a,b", "-cpuprofile=/p", "--xds", "x", "--trace", "/t"})
	want := splitArgs{
		common: []string{"--gomaxprocs", "1", "-cpuprofile=/p", "--trace", "/t"},
		role:   []string{"--config", "f", "--uids=a,b", "--xds", "x"},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(splitArgs{})); diff != "" {
		t.Errorf("splitCommonFlags (-want +got):\n%s", diff)
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions([]string{"--quick", "--scenario", "rbac,connect", "--scenario=idle-memory", "--json", "x.json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.quick || o.jsonPath != "x.json" || o.outDir != filepath.Join("bench", "results") {
		t.Errorf("options = %+v", o)
	}
	if diff := cmp.Diff([]string{"rbac", "connect", "idle-memory"}, o.scenarios); diff != "" {
		t.Errorf("scenarios (-want +got):\n%s", diff)
	}
	for _, bad := range [][]string{{"--scenario", "nope"}, {"--no-such-flag"}, {"stray"}} {
		if _, err := parseOptions(bad, io.Discard); err == nil {
			t.Errorf("parseOptions(%q) succeeded, want an error", bad)
		}
	}
}

func TestList(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"--list"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, s := range allScenarios() {
		if !strings.Contains(out.String(), s.name+" ") {
			t.Errorf("--list lacks %q:\n%s", s.name, out.String())
		}
	}
}

func TestMeshConfigAndPolicies(t *testing.T) {
	p, err := newPlan("127.55")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newPlan("10.1"); err == nil {
		t.Error("newPlan accepted a non-loopback /16")
	}
	dir := t.TempDir()
	path, err := writeFile(dir, "mesh.yaml", p.meshConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The gozt role's own loading: config and 100 policies in one batch.
	r, err := startGozt(context.Background(), []string{"--config", path, "--ca-dir", filepath.Join(dir, "ca"), "--policies", "100"})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	r.stats(m)
	r.close()
	if m["workloads"] != 6 || m["policies"] != 100 {
		t.Errorf("stats = %v, want 6 workloads and 100 policies", m)
	}
	// Every policy applies to the namespace; only the last allows the client.
	pols := benchPolicies(rbacNS, 100)
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		for _, pol := range pols {
			if err := b.InsertPolicy(pol); err != nil {
				t.Errorf("InsertPolicy(%s): %v", pol.Key(), err)
			}
		}
	})
	for i, pol := range pols {
		if pol.Scope != rbac.Namespace || pol.Namespace != rbacNS {
			t.Errorf("policy %d scope %v namespace %q", i, pol.Scope, pol.Namespace)
		}
	}
	if last := pols[len(pols)-1]; last.Action != rbac.Allow || len(last.Rules) != 3 {
		t.Errorf("last policy = %+v, want an ALLOW with the client rule", last)
	}
}

func TestProcReaders(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	end := time.Now().Add(30 * time.Millisecond)
	for time.Now().Before(end) {
	}
	cpu, err := procCPU(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Errorf("procCPU(self) = %v, %v; want > 0", cpu, err)
	}
	rss, err := procRSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Errorf("procRSS(self) = %v, %v; want at least 1 MiB", rss, err)
	}
	idle, total, err := cpuTimes()
	if err != nil || total == 0 || idle > total {
		t.Errorf("cpuTimes() = %d, %d, %v", idle, total, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("procCPU(-1) succeeded")
	}
	b0, err := machineBusy()
	if err != nil {
		t.Fatalf("machineBusy() = %v", err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	if b1, err := machineBusy(); err != nil || b1-b0 < 30*time.Millisecond {
		// 50 ms of spinning, counted in 10 ms ticks; other work only adds.
		t.Errorf("machineBusy() after 50 ms of spinning = %v, %v; before %v", b1, err, b0)
	}
}

// TestRunQuickEndToEnd runs one cheap scenario in its --quick form, as
// `gozt bench --quick --scenario round-trip` would: the gozt pair, the x/net
// pair, the two relays and the test server in child processes (this test binary, re-run
// through TestMain), then checks the figures are sane and nothing is left
// running. It asserts no speed.
func TestRunQuickEndToEnd(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the harness needs Linux /proc")
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction(workers.IdleTop))
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "copy.json")
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A /16 of its own, so that a bench run on the same machine does not
	// collide with the test.
	traceDir := filepath.Join(dir, "traces")
	err := Run(ctx, []string{"--quick", "--scenario", "round-trip", "--out", dir, "--json", jsonPath, "--net", "127.56", "--trace-dir", traceDir}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, stderr.String())
	}
	if kids := children(); len(kids) > 0 {
		t.Errorf("child processes left running: %v", kids)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 6 {
		t.Fatalf("%d results, want 6: %+v", len(rep.Results), rep.Results)
	}
	relayRows := 0
	for _, r := range rep.Results {
		if r.Scenario != "round trip" || r.Unit != "µs" || r.Samples != 3 {
			t.Errorf("result %+v: want scenario \"round trip\", unit µs, 3 samples", r)
		}
		// Every figure is a finite number of microseconds. A round trip
		// (through two proxies, or direct) is positive; an "added" figure is
		// a difference of two quantiles of three noisy samples, which a
		// direct round trip's outlier can make negative, so only its size is
		// checked.
		finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && math.Abs(v) < 1e6 }
		added := strings.HasPrefix(r.Metric, "added")
		if !finite(r.Value) || !finite(r.BaselineValue) || !added && (r.Value <= 0 || r.BaselineValue <= 0 || r.Ratio <= 0) {
			t.Errorf("result %s/%s: value %v, baseline %v, ratio %v; want finite figures, positive round trips", r.Scenario, r.Metric, r.Value, r.BaselineValue, r.Ratio)
		}
		if r.Baseline == twoRelays {
			relayRows++
		}
		if strings.HasPrefix(r.Metric, "1-byte") && r.Ratio <= 1 {
			t.Errorf("%s through gozt is %v× direct TCP; want above 1×", r.Metric, r.Ratio)
		}
	}
	if relayRows != 2 {
		t.Errorf("%d rows against %s, want one per quantile", relayRows, twoRelays)
	}
	if rep.Machine.Cores != runtime.NumCPU() || rep.Machine.Kernel == "" || rep.Machine.Go != runtime.Version() {
		t.Errorf("machine = %+v", rep.Machine)
	}
	for _, name := range []string{"latest.json", "latest.md", "latest.svg"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
	// --trace-dir: each proxy and relay process (not the test server) wrote a
	// runtime execution trace, which starts with the format's header.
	for _, name := range []string{"round-trip-gozt-out.trace", "round-trip-gozt-in.trace", "round-trip-xnet-out.trace", "round-trip-xnet-in.trace",
		"round-trip-relay-1.trace", "round-trip-relay-2.trace"} {
		b, err := os.ReadFile(filepath.Join(traceDir, name))
		if err != nil || len(b) < 16 || !bytes.HasPrefix(b, []byte("go 1.")) || !bytes.Contains(b[:16], []byte(" trace")) {
			t.Errorf("trace %s: %v, %d bytes; want a Go execution trace", name, err, len(b))
		}
	}
	if ents, _ := os.ReadDir(traceDir); len(ents) != 6 {
		t.Errorf("%d files in the trace dir, want the 4 proxies' and the 2 relays'", len(ents))
	}
	if !strings.Contains(stdout.String(), "| round trip | added p50 |") {
		t.Errorf("stdout lacks the table:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "round-trip   rep 3/3") {
		t.Errorf("stderr lacks the progress lines:\n%s", stderr.String())
	}
}

// TestProfileName: a label started again in the same scenario gets
// numbered files instead of overwriting the first process's.
func TestProfileName(t *testing.T) {
	e := &env{scen: "shared"}
	got := []string{e.profileName("gozt-in"), e.profileName("gozt-out"), e.profileName("gozt-in"), e.profileName("gozt-in")}
	e.scen = "connect"
	got = append(got, e.profileName("gozt-in"))
	want := []string{"shared-gozt-in", "shared-gozt-out", "shared-gozt-in-2", "shared-gozt-in-3", "connect-gozt-in"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("profile names (-want +got):\n%s", diff)
	}
}
