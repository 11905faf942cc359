package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// options are the flags of `gozt bench`.
type options struct {
	quick      bool
	jsonPath   string
	outDir     string
	scenarios  []string
	list       bool
	net        string
	gomaxprocs int
	profileDir string
	traceDir   string
	stallsDir  string
	stallsMin  time.Duration
	haproxy    string
	reps       int
	goztBin    string
}

// listFlag collects repeated or comma-separated values.
type listFlag struct{ vals *[]string }

func (l listFlag) String() string {
	if l.vals == nil {
		return ""
	}
	return strings.Join(*l.vals, ",")
}

func (l listFlag) Set(s string) error {
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l.vals = append(*l.vals, v)
		}
	}
	return nil
}

const usage = `usage: gozt-bench [--quick] [--scenario NAME]... [--json FILE] [--out DIR] [--list]
       gozt-bench --stalls DIR [--stalls-min D]

Runs each scenario side by side with its baselines in one run (interleaved,
repeated, medians), then writes DIR/<date>.json, .md and .svg and copies
them to DIR/latest.*. --quick: 3 short repetitions (under 2 minutes).

flags:
`

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("gozt bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.quick, "quick", false, "every scenario, 3 short repetitions (what reviewers run)")
	fs.StringVar(&o.jsonPath, "json", "", "also write the JSON results to `FILE`")
	fs.StringVar(&o.outDir, "out", filepath.Join("bench", "results"), "results `DIR`")
	fs.Var(listFlag{&o.scenarios}, "scenario", "run only scenario `NAME` (repeatable, or comma-separated; see --list)")
	fs.BoolVar(&o.list, "list", false, "list the scenarios and exit")
	fs.StringVar(&o.net, "net", "127.55", "loopback /16 (first two octets) the setup binds in")
	fs.IntVar(&o.gomaxprocs, "gomaxprocs", 0, "GOMAXPROCS of the proxy processes (0: runtime default)")
	fs.StringVar(&o.profileDir, "cpuprofile-dir", "", "write a CPU profile and an allocation profile (.allocs.pprof) of each proxy process to `DIR`")
	fs.StringVar(&o.traceDir, "trace-dir", "", "write a runtime execution trace of each proxy process to `DIR` (go tool trace; -pprof=sched for where goroutines waited to run)")
	fs.StringVar(&o.stallsDir, "stalls", "", "measure nothing: say what each long round trip of the push probe met in the traces in `DIR` (written by --trace-dir DIR --scenario xds-push)")
	fs.DurationVar(&o.stallsMin, "stalls-min", 5*time.Millisecond, "with --stalls, the shortest round trip to explain")
	fs.StringVar(&o.haproxy, "haproxy", "", "haproxy binary (default: haproxy on PATH)")
	fs.StringVar(&o.goztBin, "gozt", "", "the gozt binary of the node scenario (default: go build ./cmd/gozt into the run's directory)")
	fs.IntVar(&o.reps, "reps", 0, "measured repetitions per variant (0: 3 with --quick, else 7)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	known := map[string]bool{}
	for _, s := range allScenarios() {
		known[s.name] = true
	}
	for _, n := range o.scenarios {
		if !known[n] {
			return o, fmt.Errorf("bench: unknown scenario %q (see --list)", n)
		}
	}
	return o, nil
}

// Run is `gozt bench` (cmd/gozt-bench's main): it runs the selected
// scenarios and writes the report. With a leading `--role NAME` it instead runs one process of a
// benchmark setup; the harness starts those itself by re-running its own
// executable as `<exe> bench --role NAME ...`, so the caller must pass
// every argument after "bench" through unchanged.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "--role" || args[0] == "-role") {
		if len(args) < 2 {
			return errors.New("bench: --role needs a name")
		}
		return runRole(ctx, args[1], args[2:], stdout)
	}
	if len(args) > 0 && args[0] == netnsExecFlag {
		return execInNetns(args[1:])
	}
	opts, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if opts.stallsDir != "" {
		return StallReport(stdout, opts.stallsDir, opts.stallsMin)
	}
	if opts.list {
		for _, s := range allScenarios() {
			fmt.Fprintf(stdout, "%-12s %s\n", s.name, s.desc)
		}
		return nil
	}
	rep, runErr := runScenarios(ctx, opts, args, stderr)
	if rep == nil {
		return runErr
	}
	if err := writeReport(rep, opts, stdout, stderr); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

// runScenarios sets up the run, measures every selected scenario and
// returns the report; nothing it started is left running. A scenario that
// fails is noted in the report and the run goes on; the error lists the
// failures.
func runScenarios(ctx context.Context, opts options, args []string, stderr io.Writer) (*Report, error) {
	e, err := newEnv(ctx, opts, stderr)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{
		Date:    e.started.UTC().Format(time.RFC3339),
		Command: strings.TrimSpace("gozt bench " + strings.Join(args, " ")),
		Quick:   opts.quick,
		Machine: Machine{Cores: runtime.NumCPU(), Kernel: kernelRelease(), Go: runtime.Version(), CPU: cpuModel()},
	}
	var errs []error
	for _, s := range allScenarios() {
		if len(opts.scenarios) > 0 && !slices.Contains(opts.scenarios, s.name) {
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		e.scen = s.name
		fmt.Fprintf(stderr, "[%5.1fs] %s: %s\n", time.Since(e.started).Seconds(), s.name, s.desc)
		rs, err := s.run(ctx, e)
		if err != nil {
			err = fmt.Errorf("scenario %s: %w", s.name, err)
			fmt.Fprintf(stderr, "%v\n", err)
			rep.Notes = append(rep.Notes, err.Error())
			errs = append(errs, err)
			continue
		}
		rep.Results = append(rep.Results, rs...)
	}
	rep.Notes = append(rep.Notes, e.notes...)
	if e.noisy > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d repetitions started before the machine was %.0f%% idle (waited %v each)",
			e.noisy, quietIdle*100, e.b.quietCap))
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("each figure is the median of %d repetitions, interleaved with its baselines after one warm-up; whole run %.0f s",
		e.b.reps, time.Since(e.started).Seconds()))
	return rep, errors.Join(errs...)
}

func newEnv(ctx context.Context, opts options, stderr io.Writer) (_ *env, err error) {
	e := &env{opts: opts, b: budgetFor(opts.quick), stderr: stderr, started: time.Now()}
	if opts.reps > 0 {
		e.b.reps = opts.reps
	}
	if e.plan, err = newPlan(opts.net); err != nil {
		return nil, err
	}
	if e.exe, err = os.Executable(); err != nil {
		return nil, err
	}
	if e.tmp, err = os.MkdirTemp("", "gozt-bench-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	for _, dir := range []string{opts.profileDir, opts.traceDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	e.caDir = filepath.Join(e.tmp, "ca")
	ca, err := setupCA(e.caDir)
	if err != nil {
		return nil, err
	}
	if e.client, err = ca.Issue(ctx, clientID); err != nil {
		return nil, err
	}
	if e.mesh, err = writeFile(e.tmp, "mesh.yaml", e.plan.meshConfig()); err != nil {
		return nil, err
	}
	var tcp []string
	for _, a := range []netip.Addr{e.plan.server, e.plan.rbacSrv, e.plan.other, e.plan.plain, e.plan.sharedServer} {
		tcp = append(tcp, ap(a, appPort).String())
	}
	e.app, err = e.role(ctx, "app", "app", "--tcp", strings.Join(tcp, ","), "--tls", ap(e.plan.server, appTLS).String(),
		"--ca-dir", e.caDir, "--identity", serverID.String())
	if err != nil {
		return nil, err
	}
	return e, nil
}

// close stops every child and removes the temporary directory.
func (e *env) close() {
	stopAll(e.all)
	if e.tmp != "" {
		os.RemoveAll(e.tmp)
	}
}

// writeReport writes the JSON, Markdown and SVG files (dated, and copied to
// latest.*), the --json copy, and prints the table on stdout.
func writeReport(rep *Report, opts options, stdout, stderr io.Writer) error {
	var js, md, svg bytes.Buffer
	if err := writeJSON(&js, rep); err != nil {
		return err
	}
	if err := writeMarkdown(&md, rep); err != nil {
		return err
	}
	if err := writeSVG(&svg, rep); err != nil {
		return err
	}
	if err := os.MkdirAll(opts.outDir, 0o755); err != nil {
		return err
	}
	stamp := strings.NewReplacer(":", "", "-", "").Replace(rep.Date)
	var written []string
	for _, f := range []struct {
		ext  string
		data []byte
	}{{"json", js.Bytes()}, {"md", md.Bytes()}, {"svg", svg.Bytes()}} {
		for _, name := range []string{stamp + "." + f.ext, "latest." + f.ext} {
			path := filepath.Join(opts.outDir, name)
			if err := os.WriteFile(path, f.data, 0o644); err != nil {
				return err
			}
			written = append(written, path)
		}
	}
	if opts.jsonPath != "" {
		if err := os.WriteFile(opts.jsonPath, js.Bytes(), 0o644); err != nil {
			return err
		}
		written = append(written, opts.jsonPath)
	}
	fmt.Fprintf(stderr, "wrote %s\n", strings.Join(written, ", "))
	_, err := stdout.Write(md.Bytes())
	return err
}
