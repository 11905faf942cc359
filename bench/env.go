package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/gozt/gozt/certs"
)

// budget is how long and how often a run measures.
type budget struct {
	reps        int           // measured repetitions per variant
	dur         time.Duration // one throughput or rate measurement
	warmDur     time.Duration // the warm-up measurement
	rtts        int           // round trips per round-trip measurement
	connLat     int           // sequential connections per latency measurement
	workers     int           // concurrent clients of the connect-rate runs
	idleConns   int           // connections of the idle-memory scenario
	workloads   int           // workloads per xDS push
	nodePods    int           // pods of the node scenario
	nodeIdle    time.Duration // the node scenario's idle CPU window
	nodeProbe   time.Duration // each pod's client's interval in the node scenario's restart
	nodeReps    int           // the node scenario's repetitions (0: reps), unless --reps is given
	nodeCost    int           // the node scenario's repetitions of its idle samples (at most)
	quietWindow time.Duration // how long the idle check samples /proc/stat
	quietCap    time.Duration // longest wait for a quiet machine
}

func budgetFor(quick bool) budget {
	if quick {
		return budget{reps: 3, dur: 300 * time.Millisecond, warmDur: 150 * time.Millisecond, rtts: 1000,
			connLat: 300, workers: 4, idleConns: 2000, workloads: 100_000,
			nodePods: nodePods, nodeIdle: time.Second, nodeProbe: 10 * time.Millisecond, nodeReps: 1, nodeCost: 1,
			quietWindow: 100 * time.Millisecond, quietCap: 500 * time.Millisecond}
	}
	return budget{reps: 7, dur: 2 * time.Second, warmDur: time.Second, rtts: 20_000,
		connLat: 3000, workers: 4, idleConns: 10_000, workloads: 100_000,
		nodePods: nodePods, nodeIdle: 30 * time.Second, nodeProbe: 10 * time.Millisecond, nodeCost: 3,
		quietWindow: 200 * time.Millisecond, quietCap: 3 * time.Second}
}

// quietIdle is the fraction of CPU time that must be idle before a
// repetition starts.
const quietIdle = 0.70

// env is one run of the harness: its options, the CA and config every
// process shares, and the test server.
type env struct {
	opts    options
	b       budget
	exe     string // this executable, re-run for the roles
	tmp     string
	plan    plan
	caDir   string
	mesh    string // local config file of the gozt processes
	client  *certs.Cert
	app     *child
	stderr  io.Writer
	scen    string         // the scenario running, for profile file names
	procs   map[string]int // processes started per profile file name (profileName)
	notes   []string
	noisy   int // repetitions started after the quiet wait gave up
	started time.Time

	all []*child // every child started, for the final cleanup
}

// role starts a role process; label names it in errors and profiles.
func (e *env) role(ctx context.Context, label, role string, args ...string) (*child, error) {
	return e.roleWith(ctx, label, role, nil, args...)
}

// roleWith is role with a setup function for the command (see startRole).
func (e *env) roleWith(ctx context.Context, label, role string, setup func(*exec.Cmd), args ...string) (*child, error) {
	if e.opts.gomaxprocs > 0 {
		args = append(args, "--gomaxprocs", strconv.Itoa(e.opts.gomaxprocs))
	}
	if (e.opts.profileDir != "" || e.opts.traceDir != "") && role != "app" {
		name := e.profileName(label)
		if e.opts.profileDir != "" {
			args = append(args, "--cpuprofile", filepath.Join(e.opts.profileDir, name+".pprof"))
		}
		if e.opts.traceDir != "" {
			args = append(args, "--trace", filepath.Join(e.opts.traceDir, name+".trace"))
		}
	}
	c, err := startRole(ctx, e.exe, role, args, setup)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	c.name = label
	e.all = append(e.all, c)
	return c, nil
}

// profileName is the base name of the profile and trace files of a
// process labelled label: the scenario and the label, and from the
// label's second process in the scenario on, its number too. A scenario
// that starts a label more than once (idle memory starts a pair for every
// repetition, shared mode its pairs again for idle memory) would otherwise
// leave only the last process's files, under the first's name.
func (e *env) profileName(label string) string {
	if e.procs == nil {
		e.procs = map[string]int{}
	}
	name := e.scen + "-" + label
	e.procs[name]++
	if n := e.procs[name]; n > 1 {
		return fmt.Sprintf("%s-%d", name, n)
	}
	return name
}

// goztPair starts the outbound (client workload) and inbound (server
// workloads) gozt processes.
func (e *env) goztPair(ctx context.Context, outArgs, inArgs []string) (out, in *child, err error) {
	return e.goztPairWith(ctx, "", nil, outArgs, inArgs)
}

// goztPairWith is goztPair with a suffix for the processes' labels and a
// setup function for their commands (see startRole).
func (e *env) goztPairWith(ctx context.Context, suffix string, setup func(*exec.Cmd), outArgs, inArgs []string) (out, in *child, err error) {
	out, err = e.goztWith(ctx, "gozt-out"+suffix, clientUID, setup, outArgs...)
	if err != nil {
		return nil, nil, err
	}
	in, err = e.goztWith(ctx, "gozt-in"+suffix, serverUID, setup, inArgs...)
	if err != nil {
		out.stop()
		return nil, nil, err
	}
	return out, in, nil
}

// goztIn starts an inbound gozt process serving the workloads uids
// (comma-separated).
func (e *env) goztIn(ctx context.Context, label, uids string, args ...string) (*child, error) {
	return e.goztWith(ctx, label, uids, nil, args...)
}

// goztWith starts a gozt process serving the workloads uids, its command
// adjusted by setup if non-nil.
func (e *env) goztWith(ctx context.Context, label, uids string, setup func(*exec.Cmd), args ...string) (*child, error) {
	return e.roleWith(ctx, label, "gozt", setup, slices.Concat([]string{"--config", e.mesh, "--ca-dir", e.caDir, "--uids", uids}, args)...)
}

// xnetPair starts the x/net outbound and inbound proxies.
func (e *env) xnetPair(ctx context.Context) (out, in *child, err error) {
	in, err = e.role(ctx, "xnet-in", "xnet-in", "--listen", ap(e.plan.xnetIn, hbonePort).String(),
		"--ca-dir", e.caDir, "--identity", serverID.String())
	if err != nil {
		return nil, nil, err
	}
	out, err = e.role(ctx, "xnet-out", "xnet-out", "--listen", ap(e.plan.xnetOut, socksPort).String(),
		"--upstream", ap(e.plan.xnetIn, hbonePort).String(), "--ca-dir", e.caDir,
		"--identity", clientID.String(), "--peer", serverID.String())
	if err != nil {
		in.stop()
		return nil, nil, err
	}
	return out, in, nil
}

// The ways the harness reaches the test server.
func (e *env) directTCP() dialFunc {
	return directDial(e.plan.source(1), ap(e.plan.server, appPort))
}

func (e *env) directPlain() dialFunc { return directDial(e.plan.source(1), ap(e.plan.plain, appPort)) }

func (e *env) directTLS() dialFunc {
	return tlsDial(e.plan.source(1), ap(e.plan.server, appTLS), certs.ClientConfig(e.client, []string{serverID.String()}))
}

// goztDial reaches dst through gozt's SOCKS5 port, from source i.
func (e *env) goztDial(i int, dst netip.Addr) dialFunc {
	return socksDial(e.plan.source(i), ap(e.plan.client, socksPort), ap(dst, appPort))
}

func (e *env) xnetDial() dialFunc {
	return socksDial(e.plan.source(1), ap(e.plan.xnetOut, socksPort), ap(e.plan.server, appPort))
}

// variant is one side of a comparison: run measures once and returns its
// figures by metric name. warm marks the unrecorded warm-up run, which may
// be shorter.
type variant struct {
	name string
	run  func(ctx context.Context, warm bool) (map[string]float64, error)
}

// measure runs every variant once to warm up, then reps times interleaved
// (A B C, C B A, A B C, …: alternating the order cancels a drift in the
// machine's speed), waiting for a quiet machine before each run. Progress
// goes to stderr, showing metric show.
func (e *env) measure(ctx context.Context, scen string, vs []variant, show, unit string) (samples, error) {
	for _, v := range vs {
		if _, err := v.run(ctx, true); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", v.name, err)
		}
	}
	s := samples{}
	for rep := 1; rep <= e.b.reps; rep++ {
		order := slices.Clone(vs)
		if rep%2 == 0 {
			slices.Reverse(order)
		}
		for _, v := range order {
			if err := e.quiet(ctx); err != nil {
				return nil, err
			}
			m, err := v.run(ctx, false)
			if err != nil {
				return nil, fmt.Errorf("%s rep %d: %w", v.name, rep, err)
			}
			s.add(v.name, m)
			fmt.Fprintf(e.stderr, "[%5.1fs] %-12s rep %d/%d  %-24s %10s %-9s (median %s)\n",
				time.Since(e.started).Seconds(), scen, rep, e.b.reps, v.name,
				formatNum(m[show]), unit, formatNum(s.median(v.name, show)))
		}
	}
	return s, nil
}

// quiet waits until the machine's CPUs were at least quietIdle idle over
// one window, for at most quietCap.
func (e *env) quiet(ctx context.Context) error {
	deadline := time.Now().Add(e.b.quietCap)
	for {
		i0, t0, err := cpuTimes()
		if err != nil {
			return nil // no /proc/stat: measure anyway
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(e.b.quietWindow):
		}
		i1, t1, err := cpuTimes()
		if err != nil || t1 <= t0 || float64(i1-i0)/float64(t1-t0) >= quietIdle {
			return nil
		}
		if time.Now().After(deadline) {
			e.noisy++
			return nil
		}
	}
}

// cpuOf is the CPU time the processes have used so far.
func cpuOf(cs ...*child) time.Duration {
	var sum time.Duration
	for _, c := range cs {
		if d, err := procCPU(c.pid()); err == nil {
			sum += d
		}
	}
	return sum
}
