package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/proxy/sockopt"
)

// oneGap is the pause between the Adds of pods that arrive one at a time.
const oneGap = 5 * time.Millisecond

// nodeProc starts a process that serves istio-cni's socket at zds.
type nodeProc func(ctx context.Context, zds string) (*child, error)

// startBare starts the bare program, opening in each pod the sockets gozt
// opens with the node's environment (its SOCKS5 listener included).
func (nb *nodeBench) startBare(ctx context.Context, zds string) (*child, error) {
	args := []string{"--zds", zds}
	if slices.Contains(nb.env, "UNSTABLE_ENABLE_SOCKS5=true") {
		args = append(args, "--socks5")
	}
	return nb.e.roleWith(ctx, "bare", "bare-pods", inNetnsOf(nb.nodeNS, nb.e.exe), args...)
}

func (nb *nodeBench) startGoztProc(_ context.Context, zds string) (*child, error) {
	return nb.startGozt("gozt", zds)
}

// stopNodeProc ends a role on the close of its stdin, and gozt at once.
func stopNodeProc(c *child) {
	if c.stdin != nil {
		c.stop()
		return
	}
	kill(c)
}

// addVariant starts a process of start, times the Adds of the ZDS
// snapshot of every pod (back to back, as after a restart), removes them
// all, then times their Adds one at a time, oneGap apart. It records in
// sockets[name] what the snapshot opened in the first pod (podSockets).
func (nb *nodeBench) addVariant(name string, start nodeProc, sockets map[string][]string) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		zds := filepath.Join(nb.dir, "zds-add.sock")
		srv, err := inpodtest.Listen(zds)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		c, err := start(ctx, zds)
		if err != nil {
			return nil, err
		}
		defer stopNodeProc(c)
		conn, err := acceptZDS(ctx, srv, c)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		snap, err := nb.addPods(conn, 0)
		if err != nil {
			return nil, err
		}
		if err := snapshotSent(conn); err != nil {
			return nil, err
		}
		total := time.Since(t0)
		// What the snapshot opened in a pod, for addLatency to compare
		// with the other variant's.
		if sockets[name], err = podSockets(nb.pods[0]); err != nil {
			return nil, err
		}
		// Let the start-up's work (xDS, certificates) end before the
		// pods come again one by one.
		if err := nb.e.quiet(ctx); err != nil {
			return nil, err
		}
		if err := nb.delPods(conn); err != nil {
			return nil, err
		}
		if err := nb.e.quiet(ctx); err != nil {
			return nil, err
		}
		one, err := nb.addPods(conn, oneGap)
		if err != nil {
			return nil, err
		}
		su, ou := micros(snap), micros(one)
		return map[string]float64{
			"snap50": percentile(su, 50), "snap99": percentile(su, 99),
			"one50": percentile(ou, 50), "one99": percentile(ou, 99),
			"total": float64(total) / float64(time.Millisecond),
		}, nil
	}}
}

func (nb *nodeBench) addLatency(ctx context.Context) ([]Result, error) {
	const g, bare = "gozt", "bare program"
	sockets := map[string][]string{}
	s, err := nb.e.measure(ctx, "node", []variant{
		nb.addVariant(bare, nb.startBare, sockets),
		nb.addVariant(g, nb.startGoztProc, sockets),
	}, "one99", "µs p99 one")
	if err != nil {
		return nil, err
	}
	// The floor holds only if the bare program opened what gozt opens.
	if !slices.Equal(sockets[g], sockets[bare]) {
		return nil, fmt.Errorf("a pod's sockets after the bare program's Add differ from those after gozt's: %q, want %q",
			sockets[bare], sockets[g])
	}
	n := s.count(g, "one99")
	pods := len(nb.pods)
	two := Target{Max: true, Bound: 2}
	floor := "the floor: enter the netns and open the same sockets, nothing else"
	return []Result{
		row(nodeTitle, "ZDS add → ack p50, one pod at a time", s.median(g, "one50"), "µs", n).vs(bare, s.median(bare, "one50")),
		row(nodeTitle, "ZDS add → ack p99, one pod at a time", s.median(g, "one99"), "µs", n).vs(bare, s.median(bare, "one99")).goal(two).
			note(fmt.Sprintf("%d pods, %v apart, into a running process; %s", pods, oneGap, floor)),
		row(nodeTitle, fmt.Sprintf("ZDS add → ack p50, %d at once (the snapshot after a restart)", pods), s.median(g, "snap50"), "µs", n).vs(bare, s.median(bare, "snap50")),
		row(nodeTitle, fmt.Sprintf("ZDS add → ack p99, %d at once (the snapshot after a restart)", pods), s.median(g, "snap99"), "µs", n).vs(bare, s.median(bare, "snap99")).goal(two).
			note("the Adds sent back to back, each after the previous Ack, as soon as the fresh process connects"),
		row(nodeTitle, fmt.Sprintf("ZDS snapshot of %d, first Add to the SnapshotSent Ack", pods), s.median(g, "total"), "ms", n).vs(bare, s.median(bare, "total")),
	}, nil
}

// probes is the restart's clients: one per pod, each opening a connection
// to one of the pod's 15001, 15006 and 15008 in turn every interval, from
// a socket made in the pod's namespace, and closing it at once.
type probes struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	start  time.Time

	since   atomic.Int64 // UnixNano of the restart; successes from then on count
	refused atomic.Int64
	failed  atomic.Int64
	tries   atomic.Int64

	mu      sync.Mutex
	first   [][3]time.Time // per pod and port, the first success since `since`
	left    int            // pod ports without one
	serving chan struct{}  // closed when left reaches 0
	lastErr error
}

var probePorts = [3]uint16{15001, 15006, 15008}

func (nb *nodeBench) startProbes(ctx context.Context, every time.Duration) *probes {
	ctx, cancel := context.WithCancel(ctx)
	pr := &probes{cancel: cancel, start: time.Now(), first: make([][3]time.Time, len(nb.pods)),
		left: 3 * len(nb.pods), serving: make(chan struct{})}
	for i, p := range nb.pods {
		pr.wg.Go(func() { pr.run(ctx, i, p, every) })
	}
	return pr
}

// run is pod i's client.
func (pr *probes) run(ctx context.Context, i int, p *nodePod, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var d net.Dialer
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	for k := i; ; k++ { // pods start on different ports
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		j := k % len(probePorts)
		c, err := sockopt.DialInNetns(ctx, p.netns.Enter, &d, netip.AddrPortFrom(lo, probePorts[j]))
		now := time.Now()
		pr.tries.Add(1)
		switch {
		case err == nil:
			c.Close()
			pr.success(i, j, now)
		case errors.Is(err, syscall.ECONNRESET):
			// Accepted, then reset by gozt before the connect's outcome
			// was read: 15001 resets a connection with no original
			// destination (no redirect rules here).
			pr.success(i, j, now)
		case errors.Is(err, syscall.ECONNREFUSED):
			pr.refused.Add(1)
		case ctx.Err() == nil:
			pr.failed.Add(1)
			pr.mu.Lock()
			pr.lastErr = err
			pr.mu.Unlock()
		}
	}
}

func (pr *probes) success(i, j int, now time.Time) {
	since := pr.since.Load()
	if since == 0 || now.UnixNano() < since {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.first[i][j].IsZero() {
		pr.first[i][j] = now
		if pr.left--; pr.left == 0 {
			close(pr.serving)
		}
	}
}

// stop ends the clients and waits for them.
func (pr *probes) stop() {
	pr.cancel()
	pr.wg.Wait()
}

// servedAt returns when the last pod port accepted a first connection
// since the restart.
func (pr *probes) servedAt() time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var last time.Time
	for _, ps := range pr.first {
		for _, t := range ps {
			if t.After(last) {
				last = t
			}
		}
	}
	return last
}

// restart measures gozt's re-adoption of every pod after a SIGKILL.
func (nb *nodeBench) restart(ctx context.Context) ([]Result, error) {
	zds := filepath.Join(nb.dir, "zds-restart.sock")
	srv, err := inpodtest.Listen(zds)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	g, err := nb.adopted(ctx, srv, "gozt")
	if err != nil {
		return nil, err
	}
	defer func() {
		if g != nil {
			kill(g)
		}
	}()
	every := nb.e.b.nodeProbe
	const quiet, scaled = "no clients", "clients at a tenth of the rate"
	full := fmt.Sprintf("clients every %v", every)
	restart := func(name string, every time.Duration) variant {
		return nb.restartVariant(name, srv, &g, every)
	}
	s, err := nb.e.measure(ctx, "node", []variant{restart(quiet, 0), restart(scaled, 10*every)}, "serving", "ms serving")
	if err != nil {
		return nil, err
	}
	n := s.count(quiet, "acked")
	pods := len(nb.pods)
	clients := func(s samples, name string, every time.Duration) string {
		return fmt.Sprintf("%d clients, one per pod, each opening a connection every %v to 15001, 15006 and 15008 in turn (%.0f conn/s reached)",
			pods, every, s.median(name, "rate"))
	}
	serving := fmt.Sprintf("restart: all %d pods' 15001/15006/15008 accepting again, from the new process's start", pods)
	acked := fmt.Sprintf("restart: ZDS snapshot of %d pods acknowledged (SnapshotSent's Ack), from the new process's start", pods)
	ready := "restart: readiness (15021) 200, from the new process's start"
	refused := "restart: connections refused from the SIGKILL until all serve"
	within := Target{OnValue: true, Max: true, Bound: 1000}
	rs := []Result{
		row(nodeTitle, acked+", no clients", s.median(quiet, "acked"), "ms", n).goal(within).
			note("after a SIGKILL and an immediate start; every listener is bound by the last Ack"),
		row(nodeTitle, ready+", no clients", s.median(quiet, "ready"), "ms", n),
		row(nodeTitle, serving+", "+scaled, s.median(scaled, "serving"), "ms", n).vs(quiet, s.median(quiet, "acked")).goal(within).
			note("the first accepted connection on each pod port; " + clients(s, scaled, 10*every)),
		row(nodeTitle, refused+", "+scaled, s.median(scaled, "refused"), "conns", n).note(clients(s, scaled, 10*every)),
	}
	// At the full rate the clients may take the machine from gozt: a
	// failure (an Add unanswered within istio-cni's 5 s) is reported,
	// not fatal.
	f, err := nb.e.measure(ctx, "node", []variant{restart(full, every)}, "serving", "ms serving")
	if err != nil {
		return append(rs, row(nodeTitle, serving+", "+full, 0, "ms", 0).
			note(fmt.Sprintf("failed: %v; %d clients at %v each are too many for this machine's cores", err, pods, every))), nil
	}
	nf := f.count(full, "serving")
	return append(rs,
		row(nodeTitle, serving+", "+full, f.median(full, "serving"), "ms", nf).vs(quiet, s.median(quiet, "acked")).goal(within).
			note("the first accepted connection on each pod port; "+clients(f, full, every)),
		row(nodeTitle, acked+", "+full, f.median(full, "acked"), "ms", nf).vs(quiet, s.median(quiet, "acked")),
		row(nodeTitle, refused+", "+full, f.median(full, "refused"), "conns", nf).note(clients(f, full, every)),
	), nil
}

// restartVariant kills the gozt process *g, starts another on srv's socket
// at once and hands it every pod, with a client per pod opening a
// connection every `every` (none if zero) from before the kill until every
// pod port has accepted one.
func (nb *nodeBench) restartVariant(name string, srv *inpodtest.Server, g **child, every time.Duration) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		var pr *probes
		if every > 0 {
			pr = nb.startProbes(ctx, every)
			defer pr.stop()
			time.Sleep(200 * time.Millisecond)
			if n := pr.refused.Load() + pr.failed.Load(); n > 0 {
				return nil, fmt.Errorf("%d probes failed before the restart: %v", n, pr.lastErr)
			}
		}
		kill(*g)
		start := time.Now()
		if pr != nil {
			pr.since.Store(start.UnixNano())
		}
		var err error
		var acked time.Time
		if *g, acked, err = nb.adoptedAt(ctx, srv, "gozt"); err != nil {
			return nil, err
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		m := map[string]float64{"acked": ms(acked.Sub(start)), "ready": ms(time.Since(start))}
		if pr == nil {
			m["serving"] = m["acked"]
			return m, nil
		}
		select {
		case <-pr.serving:
		case <-time.After(20 * time.Second):
			return nil, fmt.Errorf("pods not all serving 20 s after the restart")
		}
		pr.stop()
		if n := pr.failed.Load(); n > 0 {
			return nil, fmt.Errorf("%d probes failed otherwise than refused: %v", n, pr.lastErr)
		}
		m["serving"] = ms(pr.servedAt().Sub(start))
		m["refused"] = float64(pr.refused.Load())
		m["rate"] = float64(pr.tries.Load()) / time.Since(pr.start).Seconds()
		return m, nil
	}}
}

// adopted starts gozt on srv's socket, hands it every pod in one snapshot
// and waits until it is ready.
func (nb *nodeBench) adopted(ctx context.Context, srv *inpodtest.Server, label string) (*child, error) {
	g, _, err := nb.adoptedAt(ctx, srv, label)
	return g, err
}

// adoptedAt is adopted that also returns when the SnapshotSent Ack came.
func (nb *nodeBench) adoptedAt(ctx context.Context, srv *inpodtest.Server, label string) (*child, time.Time, error) {
	g, err := nb.startGozt(label, srv.Path())
	if err != nil {
		return nil, time.Time{}, err
	}
	conn, err := acceptZDS(ctx, srv, g)
	if err == nil {
		_, err = nb.addPods(conn, 0)
	}
	if err == nil {
		err = snapshotSent(conn)
	}
	acked := time.Now()
	if err == nil {
		err = nb.waitReady(ctx, g)
	}
	if err != nil {
		kill(g)
		return nil, time.Time{}, err
	}
	return g, acked, nil
}

// adopt accepts g's ZDS connection on srv, sends it the snapshot (every
// pod if withPods, else none), waits until g is ready and returns the
// connection.
func (nb *nodeBench) adopt(ctx context.Context, srv *inpodtest.Server, g *child, withPods bool) (*inpodtest.Conn, error) {
	conn, err := acceptZDS(ctx, srv, g)
	if err != nil {
		return nil, err
	}
	if withPods {
		if _, err := nb.addPods(conn, 0); err != nil {
			return nil, err
		}
	}
	if err := snapshotSent(conn); err != nil {
		return nil, err
	}
	return conn, nb.waitReady(ctx, g)
}

// nodeSample is what one gozt process holds at a moment.
type nodeSample struct {
	idle       time.Duration // CPU time run over the idle window
	rss        int64
	fds        int
	goroutines float64
	heap       float64 // heap in use
	stack      float64 // goroutine stacks in use
	dump       string  // goroutine profile, debug=1
	heapProf   []byte  // heap profile after the collection
}

// sample measures g's CPU over idle with nothing else asked of it, then
// collects its garbage and reads its memory, descriptors and goroutines.
func (nb *nodeBench) sample(ctx context.Context, g *child, idle time.Duration) (nodeSample, error) {
	var s nodeSample
	c0, err := procRunTime(g.pid())
	if err != nil {
		return s, err
	}
	time.Sleep(idle)
	c1, err := procRunTime(g.pid())
	if err != nil {
		return s, err
	}
	s.idle = c1 - c0
	if s.heapProf, err = nb.get(ctx, adminPort, "/debug/pprof/heap?gc=1"); err != nil {
		return s, err
	}
	if s.rss, err = procRSS(g.pid()); err != nil {
		return s, err
	}
	if s.fds, err = procFDs(g.pid()); err != nil {
		return s, err
	}
	text, err := nb.get(ctx, metricsPort, "/metrics")
	if err != nil {
		return s, err
	}
	for _, m := range []struct {
		name string
		v    *float64
	}{{"go_goroutines", &s.goroutines}, {"go_memstats_heap_inuse_bytes", &s.heap}, {"go_memstats_stack_inuse_bytes", &s.stack}} {
		if *m.v, err = metricValue(text, m.name); err != nil {
			return s, err
		}
	}
	dump, err := nb.get(ctx, adminPort, "/debug/pprof/goroutine?debug=1")
	s.dump = string(dump)
	return s, err
}

// cost measures a gozt process with no pod and then with every pod, each
// after a quiet idle window.
func (nb *nodeBench) cost(ctx context.Context) ([]Result, error) {
	zds := filepath.Join(nb.dir, "zds-cost.sock")
	srv, err := inpodtest.Listen(zds)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	idle := nb.e.b.nodeIdle
	pods := len(nb.pods)
	var kinds string
	v := variant{"gozt", func(ctx context.Context, warm bool) (map[string]float64, error) {
		if warm {
			return map[string]float64{}, nil
		}
		var env []string
		if nb.e.opts.profileDir != "" {
			// Heap profiles fine enough to split a pod's tens of KiB
			// (the sampling's records inflate the heap figures).
			env = append(env, "GODEBUG=memprofilerate=512")
		}
		g, err := nb.startGozt("gozt", zds, env...)
		if err != nil {
			return nil, err
		}
		defer kill(g)
		conn, err := nb.adopt(ctx, srv, g, false)
		if err != nil {
			return nil, err
		}
		if err := nb.e.quiet(ctx); err != nil {
			return nil, err
		}
		s0, err := nb.sample(ctx, g, idle)
		if err != nil {
			return nil, err
		}
		if _, err := nb.addPods(conn, 0); err != nil {
			return nil, err
		}
		if err := nb.waitReady(ctx, g); err != nil {
			return nil, err
		}
		if err := nb.e.quiet(ctx); err != nil {
			return nil, err
		}
		s1, err := nb.sample(ctx, g, idle)
		if err != nil {
			return nil, err
		}
		kinds = goroutineDiff(s0.dump, s1.dump, pods)
		if err := nb.profile(ctx, "idle", idle, nil); err != nil {
			return nil, err
		}
		if dir := nb.e.opts.profileDir; dir != "" {
			for name, s := range map[string]nodeSample{"0": s0, fmt.Sprint(pods): s1} {
				base := filepath.Join(dir, "node-gozt-"+name+"-pods")
				if err := os.WriteFile(base+".goroutines.txt", []byte(s.dump), 0o644); err != nil {
					return nil, err
				}
				if err := os.WriteFile(base+".heap", s.heapProf, 0o644); err != nil {
					return nil, err
				}
			}
		}
		per := func(a, b float64) float64 { return (b - a) / float64(pods) }
		core := func(d time.Duration) float64 { return 100 * d.Seconds() / idle.Seconds() }
		return map[string]float64{
			"rss":   per(float64(s0.rss), float64(s1.rss)),
			"heap":  per(s0.heap, s1.heap),
			"stack": per(s0.stack, s1.stack),
			"gor":   per(s0.goroutines, s1.goroutines),
			"fds":   per(float64(s0.fds), float64(s1.fds)),
			"cpu0":  core(s0.idle),
			"cpu":   core(s1.idle),
		}, nil
	}}
	reps := nb.e.b.reps
	nb.e.b.reps = max(min(reps, nb.e.b.nodeCost), 1)
	defer func() { nb.e.b.reps = reps }()
	s, err := nb.e.measure(ctx, "node", []variant{v}, "rss", "B/pod")
	if err != nil {
		return nil, err
	}
	n := s.count("gozt", "rss")
	after := "after a collection, the same process with no pod before"
	return []Result{
		row(nodeTitle, "memory per idle pod (RSS)", s.median("gozt", "rss"), "B", n).goal(Target{OnValue: true, Max: true, Bound: 64 << 10}).
			note(fmt.Sprintf("%s; of which heap in use %.0f B, goroutine stacks %.0f B", after, s.median("gozt", "heap"), s.median("gozt", "stack"))),
		row(nodeTitle, "goroutines per idle pod", s.median("gozt", "gor"), "goroutines", n).note(kinds),
		row(nodeTitle, "descriptors per idle pod", s.median("gozt", "fds"), "fds", n),
		row(nodeTitle, fmt.Sprintf("idle CPU, %d pods, no traffic", pods), s.median("gozt", "cpu"), "% of a core", n).
			vs("no pod", s.median("gozt", "cpu0")).goal(Target{OnValue: true, Max: true, Bound: 0.1}).
			note(fmt.Sprintf("the process's run time (schedstat) over %v with nothing asked of it", idle)),
	}, nil
}

// goroutineDiff names the goroutines that n pods added between two
// goroutine profiles (debug=1), by the outermost function of this module in
// their stacks, as "per pod: 1.0 × f, …".
func goroutineDiff(before, after string, n int) string {
	b, a := goroutineKinds(before), goroutineKinds(after)
	type kind struct {
		name string
		per  float64
	}
	var ks []kind
	for name, c := range a {
		if d := c - b[name]; d >= n/2 && d > 0 {
			ks = append(ks, kind{name, float64(d) / float64(n)})
		}
	}
	slices.SortFunc(ks, func(x, y kind) int {
		if x.per != y.per {
			if x.per > y.per {
				return -1
			}
			return 1
		}
		return strings.Compare(x.name, y.name)
	})
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%.1f × %s", k.per, k.name))
	}
	if len(parts) == 0 {
		return "no goroutine kind grows with the pods"
	}
	return "per pod: " + strings.Join(parts, ", ")
}

// goroutineKinds counts a goroutine profile's goroutines (debug=1 text) by
// the outermost function of this module in each stack (else the
// outermost function).
func goroutineKinds(dump string) map[string]int {
	out := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(dump))
	count, outer, ours := 0, "", ""
	flush := func() {
		if count > 0 {
			k := ours
			if k == "" {
				k = outer
			}
			out[k] += count
		}
		count, outer, ours = 0, "", ""
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "#"):
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			fn := f[2]
			if i := strings.LastIndex(fn, "+0x"); i > 0 {
				fn = fn[:i]
			}
			outer = fn
			if strings.HasPrefix(fn, "github.com/gozt/gozt/") {
				ours = strings.TrimPrefix(fn, "github.com/gozt/gozt/")
			}
		default:
			if c, _, ok := strings.Cut(line, " @ "); ok {
				flush()
				fmt.Sscan(c, &count)
			}
		}
	}
	flush()
	return out
}

// traffic measures connections and round trips spread over every pod
// against the same through one pod, in one gozt process.
func (nb *nodeBench) traffic(ctx context.Context) ([]Result, error) {
	zds := filepath.Join(nb.dir, "zds-traffic.sock")
	srv, err := inpodtest.Listen(zds)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	g, err := nb.adopted(ctx, srv, "gozt")
	if err != nil {
		return nil, err
	}
	defer kill(g)
	var next atomic.Int64
	pods := len(nb.pods)
	spread := nb.podDial(func() int { return int(next.Add(1)-1) % pods })
	one := nb.podDial(func() int { return 0 })
	w := nb.e.b.workers
	var nextFew atomic.Int64
	few := nb.podDial(func() int { return int(nextFew.Add(1)-1) % min(w, pods) })
	onePod, fewPods, all := "1 pod", fmt.Sprintf("%d pods", min(w, pods)), fmt.Sprintf("%d pods", pods)
	// Each pod's first connection opens its HBONE connection (an mTLS
	// handshake): open them all before measuring, whatever the warm-up's
	// length.
	for range pods {
		if err := connectOnce(ctx, spread); err != nil {
			return nil, fmt.Errorf("first connection through each pod: %w", err)
		}
	}
	c, err := nb.e.measure(ctx, "node", []variant{nb.rateOf(onePod, one, g), nb.rateOf(fewPods, few, g), nb.rateOf(all, spread, g)}, "rate", "conn/s")
	if err != nil {
		return nil, err
	}
	r, err := nb.e.measure(ctx, "node", []variant{nb.rttOf(onePod, one), nb.rttOf(all, spread)}, "p50", "µs p50")
	if err != nil {
		return nil, err
	}
	for name, dial := range map[string]dialFunc{"traffic-1-pod": one, "traffic-few-pods": few, "traffic-all-pods": spread} {
		err := nb.profile(ctx, name, 3*time.Second, func(ctx context.Context, d time.Duration) error {
			n, t, err := connectRate(ctx, dial, nb.e.b.workers, d)
			if err == nil {
				fmt.Fprintf(nb.e.stderr, "node: profile %s: %d connections in %.1f s\n", name, n, t.Seconds())
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	nc, nr := c.count(all, "rate"), r.count(all, "p50")
	return []Result{
		row(nodeTitle, fmt.Sprintf("connect + 1 byte + close, %d clients spread over the pods", w), c.median(all, "rate"), "conn/s", nc).
			vs(onePod, c.median(onePod, "rate")).goal(Target{Bound: 0.95}).
			note("each connection through the next pod's SOCKS5 port to its own test server over HBONE (the pod's 15008)"),
		row(nodeTitle, "proxy CPU per connection", c.median(all, "cpu"), "µs", nc).vs(onePod, c.median(onePod, "cpu")),
		row(nodeTitle, fmt.Sprintf("connect + 1 byte + close, %d clients spread over the pods", w), c.median(all, "rate"), "conn/s", nc).
			vs(fewPods, c.median(fewPods, "rate")).
			note("against as many pods as clients: through one pod the clients' streams share one HBONE connection, whose reads and writes then carry several frames"),
		row(nodeTitle, "proxy CPU per connection", c.median(all, "cpu"), "µs", nc).vs(fewPods, c.median(fewPods, "cpu")),
		row(nodeTitle, fmt.Sprintf("1-byte round trip p50, %d clients spread over the pods", w), r.median(all, "p50"), "µs", nr).vs(onePod, r.median(onePod, "p50")).
			note(fmt.Sprintf("%d round trips per connection", rttsPerConn)),
		row(nodeTitle, fmt.Sprintf("1-byte round trip p99, %d clients spread over the pods", w), r.median(all, "p99"), "µs", nr).vs(onePod, r.median(onePod, "p99")),
	}, nil
}

// profile writes a CPU profile of gozt over d, from its admin port, to
// node-gozt-NAME.pprof under --cpuprofile-dir while load runs (if
// non-nil); without --cpuprofile-dir it does nothing.
func (nb *nodeBench) profile(ctx context.Context, name string, d time.Duration, load func(context.Context, time.Duration) error) error {
	dir := nb.e.opts.profileDir
	if dir == "" {
		return nil
	}
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	var loadErr error
	var wg sync.WaitGroup
	if load != nil {
		wg.Go(func() { loadErr = load(ctx, time.Duration(secs)*time.Second) })
	}
	b, err := nb.get(ctx, adminPort, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs))
	wg.Wait()
	if err = errors.Join(err, loadErr); err != nil {
		return fmt.Errorf("profile %s: %w", name, err)
	}
	return os.WriteFile(filepath.Join(dir, "node-gozt-"+name+".pprof"), b, 0o644)
}

// profileAdds writes, under --cpuprofile-dir, a CPU profile of a running
// gozt taking every pod and letting it go again, back to back, for 2 s:
// where an Add's time goes outside the start-up's contention.
func (nb *nodeBench) profileAdds(ctx context.Context) error {
	if nb.e.opts.profileDir == "" {
		return nil
	}
	zds := filepath.Join(nb.dir, "zds-profile.sock")
	srv, err := inpodtest.Listen(zds)
	if err != nil {
		return err
	}
	defer srv.Close()
	g, err := nb.startGozt("gozt", zds)
	if err != nil {
		return err
	}
	defer kill(g)
	conn, err := nb.adopt(ctx, srv, g, false)
	if err != nil {
		return err
	}
	if err := nb.e.quiet(ctx); err != nil {
		return err
	}
	return nb.profile(ctx, "adds", 2*time.Second, func(ctx context.Context, d time.Duration) error {
		for end := time.Now().Add(d); time.Now().Before(end); {
			if _, err := nb.addPods(conn, 0); err != nil {
				return err
			}
			if err := nb.delPods(conn); err != nil {
				return err
			}
		}
		return nil
	})
}

// rateOf is e.rate with gozt's CPU per connection.
func (nb *nodeBench) rateOf(name string, dial dialFunc, g *child) variant {
	v := nb.e.rate(name, dial)
	run := v.run
	v.run = func(ctx context.Context, warm bool) (map[string]float64, error) {
		c0 := cpuOf(g)
		t0 := time.Now()
		m, err := run(ctx, warm)
		if err != nil {
			return nil, err
		}
		if conns := m["rate"] * time.Since(t0).Seconds(); conns > 0 {
			m["cpu"] = float64((cpuOf(g)-c0)/time.Microsecond) / conns
		}
		return m, nil
	}
	return v
}

// rttsPerConn is how many round trips each connection of rttOf carries.
const rttsPerConn = 10

// rttOf is a round-trip variant with e.b.workers clients, each opening
// connections with dial one after another, rttsPerConn round trips on each,
// until they have e.b.rtts in all (a quarter when warming up).
func (nb *nodeBench) rttOf(name string, dial dialFunc) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		total := nb.e.b.rtts
		if warm {
			total /= 4
		}
		w := nb.e.b.workers
		var (
			mu   sync.Mutex
			all  []time.Duration
			errs []error
			wg   sync.WaitGroup
		)
		for range w {
			wg.Go(func() {
				var mine []time.Duration
				var err error
				for len(mine) < total/w && err == nil {
					var ds []time.Duration
					ds, err = roundTrips(ctx, dial, rttsPerConn)
					mine = append(mine, ds...)
				}
				mu.Lock()
				defer mu.Unlock()
				all = append(all, mine...)
				errs = append(errs, err)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		us := micros(all)
		return map[string]float64{"p50": percentile(us, 50), "p99": percentile(us, 99)}, nil
	}}
}

// podSockets lists the listening TCP and the bound UDP sockets in p's
// network namespace, sorted, each as its /proc net file names it and its
// port: "tcp6 00000000000000000000000000000000:15001" (the address in the
// file's hex). The files are read through /proc/thread-self, which shows
// the reading thread's namespace (/proc/self/net shows the main thread's).
func podSockets(p *nodePod) ([]string, error) {
	var out []string
	err := p.netns.Run(func() error {
		for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
			b, err := os.ReadFile("/proc/thread-self/net/" + proto)
			if err != nil {
				return err
			}
			_, rows, _ := strings.Cut(string(b), "\n") // the header
			for row := range strings.Lines(rows) {
				// sl local_address rem_address st ...
				f := strings.Fields(row)
				if len(f) < 4 || (strings.HasPrefix(proto, "tcp") && f[3] != "0A") { // TCP_LISTEN
					continue
				}
				addr, port, _ := strings.Cut(f[1], ":")
				n, err := strconv.ParseUint(port, 16, 16)
				if err != nil {
					return fmt.Errorf("/proc/thread-self/net/%s: local address %q: %w", proto, f[1], err)
				}
				out = append(out, fmt.Sprintf("%s %s:%d", proto, addr, n))
			}
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}
