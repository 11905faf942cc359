package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"time"
)

// scenario is one comparison of issue 5.
type scenario struct {
	name  string // for --scenario
	title string // Result.Scenario
	desc  string // for --list
	run   func(ctx context.Context, e *env) ([]Result, error)
}

func allScenarios() []scenario {
	return []scenario{
		{"passthrough", "passthrough", "plaintext passthrough throughput, 1 connection, vs direct TCP, a splice relay and HAProxy", runPassthrough},
		{"hbone-up", "HBONE upload", "HBONE throughput client→server, 1 stream, vs direct TCP, direct mTLS and the x/net pair", runHBONEUp},
		{"hbone-down", "HBONE download", "HBONE throughput server→client, 1 stream, vs direct TCP, direct mTLS and the x/net pair", runHBONEDown},
		{"hbone-multi", "HBONE 8 streams", "HBONE upload on 8 streams of one connection and on 8 connections, vs 1 stream", runHBONEMulti},
		{"round-trip", "round trip", "1-byte round trip p50/p99 through HBONE, vs direct TCP and the x/net pair", runRoundTrip},
		{"first-byte", "first response byte", "connect to the first response byte of a client-speaks-first exchange through HBONE (pooled), vs direct TCP and the x/net pair", runFirstByte},
		{"connect", "connect rate", "connect + 1 byte + close rate through HBONE (pooled), vs direct TCP and the x/net pair", runConnect},
		{"handshake", "new mTLS per request", "connect rate with the HBONE pool off (one mTLS handshake per request), vs bare TLS handshakes", runHandshake},
		{"idle-memory", "idle memory", "memory per idle connection per proxy after one round trip each, vs the x/net pair", runIdleMemory},
		{"rbac", "RBAC 10k policies", "connection round trip to a workload under 10,000 policies, vs one without", runRBAC},
		{"shared", sharedTitle, "shared (in-pod) mode, root only: connect rate, HBONE throughput and idle memory with every socket made in a pod netns, vs dedicated mode", runShared},
		{"node", nodeTitle, "a node in shared mode, root only: 110 pods handed over by ZDS; add latency vs a bare program, restart re-adoption, per-pod cost, traffic over 110 pods vs 1", runNode},
		{"xds-push", "xDS push", "xDS push of 100,000 workloads during traffic: apply time, size, longest stall of a live connection", runXDSPush},
	}
}

// m1Stream is the HBONE scenarios' throughput metric.
const m1Stream = "throughput, 1 stream"

type bulkFunc func(ctx context.Context, dial dialFunc, d time.Duration) (int64, time.Duration, error)

// bulk is a throughput variant: MB/s, and CPU-s per GB of procs if any.
func (e *env) bulk(name string, dial dialFunc, fn bulkFunc, procs ...*child) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		d := e.b.dur
		if warm {
			d = e.b.warmDur
		}
		cpu0 := cpuOf(procs...)
		busy0, busyErr := machineBusy()
		n, t, err := fn(ctx, dial, d)
		if err != nil {
			return nil, err
		}
		busy1, err := machineBusy()
		if busyErr == nil {
			busyErr = err
		}
		gb := float64(n) / 1e9
		m := map[string]float64{"throughput": float64(n) / t.Seconds() / 1e6}
		if len(procs) > 0 {
			m["cpu"] = (cpuOf(procs...) - cpu0).Seconds() / gb
		}
		if busyErr == nil && n > 0 {
			m["machine"] = (busy1 - busy0).Seconds() / gb
		}
		return m, nil
	}}
}

func runPassthrough(ctx context.Context, e *env) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	relay, err := e.role(ctx, "relay", "relay", "--listen", ap(e.plan.relay, appPort).String(), "--target", ap(e.plan.plain, appPort).String())
	if err != nil {
		return nil, err
	}
	defer relay.stop()
	vs := []variant{
		e.bulk("direct TCP", e.directPlain(), upload),
		e.bulk("splice relay", directDial(e.plan.source(1), ap(e.plan.relay, appPort)), upload, relay),
	}
	hap, hapErr := e.haproxy(ctx)
	if hap != nil {
		defer hap.stop()
		vs = append(vs, e.bulk("HAProxy", directDial(e.plan.source(1), ap(e.plan.haproxy, appPort)), upload, hap))
	}
	vs = append(vs, e.bulk("gozt", e.goztDial(1, e.plan.plain), upload, out, in))
	s, err := e.measure(ctx, "passthrough", vs, "throughput", "MB/s")
	if err != nil {
		return nil, err
	}
	const t, m = "passthrough", "throughput, 1 connection"
	g, n := s.median("gozt", "throughput"), s.count("gozt", "throughput")
	rs := []Result{
		row(t, m, g, "MB/s", n).vs("direct TCP", s.median("direct TCP", "throughput")),
		row(t, m, g, "MB/s", n).vs("splice relay", s.median("splice relay", "throughput")).goal(Target{Bound: 0.95}),
	}
	if hap != nil {
		rs = append(rs, row(t, m, g, "MB/s", n).vs("HAProxy", s.median("HAProxy", "throughput")).goal(Target{Bound: 1}))
	} else {
		rs = append(rs, row(t, m, g, "MB/s", n).note("HAProxy row skipped: "+hapErr.Error()))
	}
	cpu := s.median("gozt", "cpu")
	rs = append(rs, row(t, "proxy CPU per GB", cpu, "CPU-s/GB", n).vs("splice relay", s.median("splice relay", "cpu")))
	if hap != nil {
		rs = append(rs, row(t, "proxy CPU per GB", cpu, "CPU-s/GB", n).vs("HAProxy", s.median("HAProxy", "cpu")))
	}
	return rs, nil
}

func runHBONEUp(ctx context.Context, e *env) ([]Result, error) {
	return runHBONE(ctx, e, "HBONE upload", upload)
}

func runHBONEDown(ctx context.Context, e *env) ([]Result, error) {
	return runHBONE(ctx, e, "HBONE download", download)
}

func runHBONE(ctx context.Context, e *env, title string, fn bulkFunc) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	xo, xi, err := e.xnetPair(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{xo, xi})
	vs := []variant{
		e.bulk("direct TCP", e.directTCP(), fn),
		e.bulk("direct mTLS", e.directTLS(), fn),
		e.bulk("x/net pair", e.xnetDial(), fn, xo, xi),
		e.bulk("gozt", e.goztDial(1, e.plan.server), fn, out, in),
	}
	s, err := e.measure(ctx, e.scen, vs, "throughput", "MB/s")
	if err != nil {
		return nil, err
	}
	const m = m1Stream // the rows below
	g, n := s.median("gozt", "throughput"), s.count("gozt", "throughput")
	mtls := s.median("direct mTLS", "throughput")
	rs := []Result{
		row(title, m, g, "MB/s", n).vs("direct TCP", s.median("direct TCP", "throughput")).goal(Target{Bound: 0.30}),
		row(title, m, g, "MB/s", n).vs("direct mTLS", mtls),
		row(title, m, g, "MB/s", n).vs("x/net pair", s.median("x/net pair", "throughput")).goal(Target{Bound: 1.5}),
		row(title, "CPU per GB, both proxies", s.median("gozt", "cpu"), "CPU-s/GB", n).
			vs("x/net pair", s.median("x/net pair", "cpu")).goal(Target{OnValue: true, Max: true, Bound: 1.1}),
	}
	return append(rs, tunnelFloor(title, s, g, mtls, n, runtime.NumCPU())...), nil
}

// tunnelFloor returns the rows that measure, in the same run, the least
// work any two-proxy TLS tunnel does per byte on this machine, and the
// throughput that leaves when client, proxies and server share its cores.
// A tunnel's path is one TLS connection and two TCP connections: the
// client's to the outbound proxy and the inbound proxy's to the server. So
// its whole-machine CPU per GB (every process and the kernel's loopback
// work, from /proc/stat) is at least direct mTLS's plus twice direct TCP's,
// and the two proxies' own at least direct mTLS's plus one direct TCP's
// (they do the TLS pair's sealing, opening, writes and reads, and one TCP
// pair's read and write). Where every core is busy (as here, where one
// machine runs all four processes) throughput is at most cores ÷ that
// floor. g and mtls are gozt's and direct mTLS's throughput in MB/s.
func tunnelFloor(title string, s samples, g, mtls float64, n, cores int) []Result {
	tls, tcp := s.median("direct mTLS", "machine"), s.median("direct TCP", "machine")
	if tls <= 0 || tcp <= 0 {
		return nil // no /proc/stat
	}
	path := tls + 2*tcp
	ceiling := float64(cores) / path * 1e3 // MB/s
	return []Result{
		row(title, "CPU per GB, whole machine", s.median("gozt", "machine"), "CPU-s/GB", n).
			vs("direct mTLS + 2 × direct TCP", path),
		row(title, "CPU per GB, both proxies", s.median("gozt", "cpu"), "CPU-s/GB", n).
			vs("direct mTLS + direct TCP, whole machine", tls+tcp),
		row(title, m1Stream, g, "MB/s", n).vs("ceiling on this machine", ceiling).
			note(fmt.Sprintf("at most %.2f× direct mTLS here: %d cores ÷ (direct mTLS + 2 × direct TCP) CPU-s per GB of the whole machine", ceiling/mtls, cores)),
	}
}

func runHBONEMulti(ctx context.Context, e *env) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	one := []dialFunc{e.goztDial(1, e.plan.server)}
	// The pool key includes the downstream source IP, so 8 sources get 8
	// HBONE connections, and one source shares one.
	var eight []dialFunc
	for i := 1; i <= 8; i++ {
		eight = append(eight, e.goztDial(i, e.plan.server))
	}
	par := func(dials []dialFunc, n int) bulkFunc {
		return func(ctx context.Context, _ dialFunc, d time.Duration) (int64, time.Duration, error) {
			return uploadParallel(ctx, dials, n, d)
		}
	}
	vs := []variant{
		e.bulk("1 stream", nil, par(one, 1), out, in),
		e.bulk("8 streams, 1 connection", nil, par(one, 8), out, in),
		e.bulk("8 connections", nil, par(eight, 8), out, in),
	}
	s, err := e.measure(ctx, "hbone-multi", vs, "throughput", "MB/s")
	if err != nil {
		return nil, err
	}
	const t = "HBONE 8 streams"
	base := s.median("1 stream", "throughput")
	return []Result{
		row(t, "upload, 8 streams on 1 connection", s.median("8 streams, 1 connection", "throughput"), "MB/s", s.count("1 stream", "throughput")).vs("1 stream", base),
		row(t, "upload, 8 connections", s.median("8 connections", "throughput"), "MB/s", s.count("1 stream", "throughput")).vs("1 stream", base),
		row(t, "CPU per GB, 8 streams on 1 connection", s.median("8 streams, 1 connection", "cpu"), "CPU-s/GB", s.count("1 stream", "cpu")).vs("1 stream", s.median("1 stream", "cpu")),
	}, nil
}

// rtt is a round-trip variant: p50 and p99 in µs.
func (e *env) rtt(name string, dial dialFunc) variant {
	return e.timed(name, e.b.rtts, roundTrips, dial, 50, 99)
}

// timed is a variant that takes n timings with sample (a quarter of them
// when warming up) and reports the percentiles pcts in µs as "p50", "p99"...
func (e *env) timed(name string, n int, sample func(context.Context, dialFunc, int) ([]time.Duration, error), dial dialFunc, pcts ...float64) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		k := n
		if warm {
			k /= 4
		}
		ds, err := sample(ctx, dial, k)
		if err != nil {
			return nil, err
		}
		us := micros(ds)
		out := make(map[string]float64, len(pcts))
		for _, p := range pcts {
			out[fmt.Sprintf("p%g", p)] = percentile(us, p)
		}
		return out, nil
	}}
}

func runRoundTrip(ctx context.Context, e *env) ([]Result, error) {
	return runLatency(ctx, e, "round-trip", "round trip", e.rtt, func(q string) (string, string, *Target) {
		return "1-byte " + q, "added " + q, &Target{Max: true, Bound: 0.7}
	})
}

// runLatency runs latency scenario scen (rows titled title): variants made
// by mk through direct TCP, the x/net pair and gozt, interleaved; for p50
// and p99, a row of gozt's figure ÷ direct TCP's and one of the added
// latency (gozt's less direct TCP's) ÷ the x/net pair's, with the metric
// names and the added row's target (or nil) that metrics gives.
func runLatency(ctx context.Context, e *env, scen, title string, mk func(string, dialFunc) variant,
	metrics func(q string) (whole, added string, target *Target)) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	xo, xi, err := e.xnetPair(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{xo, xi})
	relays, err := e.relayChain(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll(relays)
	vs := []variant{
		mk("direct TCP", e.directTCP()),
		mk("x/net pair", e.xnetDial()),
		mk("gozt", e.goztDial(1, e.plan.server)),
		mk(twoRelays, e.relayChainDial()),
	}
	s, err := e.measure(ctx, scen, vs, "p50", "µs p50")
	if err != nil {
		return nil, err
	}
	n := s.count("gozt", "p50")
	var rs []Result
	for _, q := range []string{"p50", "p99"} {
		g, d, x, r := s.median("gozt", q), s.median("direct TCP", q), s.median("x/net pair", q), s.median(twoRelays, q)
		whole, addedName, target := metrics(q)
		rs = append(rs, row(title, whole, g, "µs", n).vs("direct TCP", d))
		added := row(title, addedName, g-d, "µs", n).vs("x/net pair", x-d)
		if target != nil {
			added = added.goal(*target).note(fmt.Sprintf("two splice relays add %.2f× the x/net pair's here", ratio(r-d, x-d)))
		}
		rs = append(rs, added, row(title, addedName, g-d, "µs", n).vs(twoRelays, r-d))
	}
	return rs, nil
}

// twoRelays names the latency and connect scenarios' floor: two of the
// harness's splice relays in a row (client → relay → relay → server),
// about the least that two more processes on the path add to a
// connection's latency on this machine, with no TLS, HTTP/2, routing or
// policy. A two-proxy mesh does their work and more (it is not a strict
// bound: for one byte a read and a write can beat splice's two calls
// through a pipe). The first relay is addressed through SOCKS5 as gozt and
// the x/net pair are (the same client, pipelined handshake and two
// replies), so that the floor pays the harness's addressing as they do:
// without it, the client's two extra wake-ups for the replies and the
// handshake's reads and writes were counted against the pairs alone.
const twoRelays = "two splice relays"

// relayChain starts the two relays of twoRelays; relayChainDial reaches
// the test server through them.
func (e *env) relayChain(ctx context.Context) ([]*child, error) {
	second, err := e.role(ctx, "relay-2", "relay", "--listen", ap(e.plan.relay, relayChainPort+1).String(),
		"--target", ap(e.plan.server, appPort).String())
	if err != nil {
		return nil, err
	}
	first, err := e.role(ctx, "relay-1", "relay", "--listen", ap(e.plan.relay, relayChainPort).String(),
		"--target", ap(e.plan.relay, relayChainPort+1).String(), "--socks")
	if err != nil {
		second.stop()
		return nil, err
	}
	return []*child{first, second}, nil
}

func (e *env) relayChainDial() dialFunc {
	return socksDial(e.plan.source(1), ap(e.plan.relay, relayChainPort), ap(e.plan.server, appPort))
}

// firstByte is a first-response-byte variant: p50 and p99 in µs of
// connect + 1 byte + its echo, the client speaking first.
func (e *env) firstByte(name string, dial dialFunc) variant {
	return e.timed(name, e.b.connLat, connectLatencies, dial, 50, 99)
}

// runFirstByte times a new connection's first exchange when the client
// speaks first: from the start of the dial to the first response byte. The
// client's byte leaves with the SOCKS5 handshake (as a client's request
// follows its TCP handshake at once), so a proxy that holds it until its
// CONNECT is answered adds a tunnel crossing that one sending it with the
// CONNECT does not. The HBONE connection is pooled (the warm-up opens it):
// what is timed is one CONNECT stream and the exchange on it.
func runFirstByte(ctx context.Context, e *env) ([]Result, error) {
	return runLatency(ctx, e, "first-byte", "first response byte", e.firstByte, func(q string) (string, string, *Target) {
		var target *Target
		if q == "p50" {
			target = &Target{Max: true, Bound: 0.7}
		}
		return "connect to first response byte " + q, "added " + q, target
	})
}

// rate is a connect-rate variant: connections per second, and if procs
// are given proxy CPU µs per connection, in all ("cpu") and in each
// process ("cpu0", "cpu1", …), and the heap bytes the procs allocated per
// connection, in all ("alloc"). Allocation, unlike CPU time, hardly varies
// with the machine's load, so it shows a change of the per-connection work
// that this VM's noise hides in the CPU figure.
func (e *env) rate(name string, dial dialFunc, procs ...*child) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		d := e.b.dur
		if warm {
			d = e.b.warmDur
		}
		alloc0, err := heapAllocs(ctx, procs...) // before the CPU reading: the call costs the procs some
		if err != nil {
			return nil, err
		}
		cpu0 := make([]time.Duration, len(procs))
		for i, p := range procs {
			cpu0[i] = cpuOf(p)
		}
		n, t, err := connectRate(ctx, dial, e.b.workers, d)
		if err != nil {
			return nil, err
		}
		m := map[string]float64{"rate": float64(n) / t.Seconds()}
		if len(procs) == 0 || n == 0 {
			return m, nil
		}
		var sum time.Duration
		for i, p := range procs {
			used := cpuOf(p) - cpu0[i]
			sum += used
			m[fmt.Sprintf("cpu%d", i)] = float64(used/time.Microsecond) / float64(n)
		}
		m["cpu"] = float64(sum/time.Microsecond) / float64(n)
		alloc1, err := heapAllocs(ctx, procs...)
		if err != nil {
			return nil, err
		}
		m["alloc"] = float64(alloc1-alloc0) / float64(n)
		return m, nil
	}}
}

// heapAllocs returns the heap bytes the processes cs have allocated so far,
// summed (runtime/metrics /gc/heap/allocs:bytes).
func heapAllocs(ctx context.Context, cs ...*child) (uint64, error) {
	return statSum(ctx, "heap_allocs", cs...)
}

// runConnect measures new connections per second through each pair, and
// through the two splice relays of twoRelays: what two more processes on
// the path leave of the rate on this machine with no TLS, HTTP/2, routing
// or policy. Not a strict bound either way: the relays dial a TCP
// connection between them for every connection, where gozt's pair shares a
// pooled HBONE connection.
func runConnect(ctx context.Context, e *env) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	xo, xi, err := e.xnetPair(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{xo, xi})
	relays, err := e.relayChain(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll(relays)
	vs := []variant{
		e.rate("direct TCP", e.directTCP()),
		e.rate("x/net pair", e.xnetDial(), xo, xi),
		e.rate("gozt", e.goztDial(1, e.plan.server), out, in),
		e.rate(twoRelays, e.relayChainDial(), relays...),
	}
	s, err := e.measure(ctx, "connect", vs, "rate", "conn/s")
	if err != nil {
		return nil, err
	}
	const t = "connect rate"
	m := fmt.Sprintf("connect + 1 byte + close, pooled, %d clients", e.b.workers)
	g, n := s.median("gozt", "rate"), s.count("gozt", "rate")
	return []Result{
		row(t, m, g, "conn/s", n).vs("direct TCP", s.median("direct TCP", "rate")),
		row(t, m, g, "conn/s", n).vs("x/net pair", s.median("x/net pair", "rate")).goal(Target{Bound: 1.5}).
			note(fmt.Sprintf("two splice relays reach %.2f× the x/net pair's rate here", ratio(s.median(twoRelays, "rate"), s.median("x/net pair", "rate")))),
		row(t, "proxy CPU per connection", s.median("gozt", "cpu"), "µs", n).vs("x/net pair", s.median("x/net pair", "cpu")),
		row(t, "proxy heap allocated per connection", s.median("gozt", "alloc"), "B", n).vs("x/net pair", s.median("x/net pair", "alloc")),
		row(t, m, g, "conn/s", n).vs(twoRelays, s.median(twoRelays, "rate")),
		row(t, "proxy CPU per connection", s.median("gozt", "cpu"), "µs", n).vs(twoRelays, s.median(twoRelays, "cpu")),
	}, nil
}

func runHandshake(ctx context.Context, e *env) ([]Result, error) {
	// With one stream per pooled connection, a connection leaves the pool
	// at its first checkout and closes when its stream ends: every
	// request pays a new mTLS handshake.
	out, in, err := e.goztPair(ctx, []string{"--pool-max-streams", "1"}, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	vs := []variant{
		e.rate("bare TLS handshake", e.directTLS()),
		e.rate("gozt, pool off", e.goztDial(1, e.plan.server), out, in),
	}
	s, err := e.measure(ctx, "handshake", vs, "rate", "conn/s")
	if err != nil {
		return nil, err
	}
	const t = "new mTLS per request"
	m := fmt.Sprintf("connect + 1 byte + close, pool off, %d clients", e.b.workers)
	n := s.count("gozt, pool off", "rate")
	return []Result{
		row(t, m, s.median("gozt, pool off", "rate"), "conn/s", n).vs("bare TLS handshake", s.median("bare TLS handshake", "rate")),
		row(t, "proxy CPU per connection", s.median("gozt, pool off", "cpu"), "µs", n),
	}, nil
}

// idle is an idle-memory variant: bytes of RSS per open connection, for
// the outbound and the inbound proxy. Each run starts the pair afresh, so
// every run pays for the same connections (pooled HBONE connections
// included) from the same starting point.
func (e *env) idle(name string, pair func(context.Context) (out, in *child, err error), dial dialFunc) variant {
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		n := e.b.idleConns
		if warm {
			n /= 10
		}
		out, in, err := pair(ctx)
		if err != nil {
			return nil, err
		}
		defer stopAll([]*child{out, in})
		if e.opts.profileDir != "" && !warm {
			// Resolve a few hundred bytes per connection in the heap profile.
			for _, c := range []*child{out, in} {
				if _, err := c.call(ctx, "memprofilerate 256"); err != nil {
					return nil, err
				}
			}
		}
		rss0 := rssAfterGC(ctx, out, in)
		if e.opts.profileDir != "" && !warm {
			// The same profiles before the connections, to subtract.
			for _, c := range []*child{out, in} {
				path := filepath.Join(e.opts.profileDir, fmt.Sprintf("idle-memory-%s-before.heap", c.name))
				if _, err := c.call(ctx, "heapprofile "+path); err != nil {
					return nil, err
				}
			}
		}
		g0, err := goroutines(ctx, out, in)
		if err != nil {
			return nil, err
		}
		conns, err := openIdle(ctx, dial, n, 16)
		if err != nil {
			return nil, err
		}
		defer closeAll(conns)
		time.Sleep(100 * time.Millisecond) // let the last handshakes' garbage become collectable
		rss1 := rssAfterGC(ctx, out, in)
		g1, err := goroutines(ctx, out, in)
		if err != nil {
			return nil, err
		}
		if e.opts.profileDir != "" && !warm {
			for _, c := range []*child{out, in} {
				path := filepath.Join(e.opts.profileDir, fmt.Sprintf("idle-memory-%s.heap", c.name))
				if _, err := c.call(ctx, "heapprofile "+path); err != nil {
					return nil, err
				}
			}
		}
		return map[string]float64{
			"out":  float64(rss1[0]-rss0[0]) / float64(n),
			"in":   float64(rss1[1]-rss0[1]) / float64(n),
			"gout": float64(g1[0]-g0[0]) / float64(n),
			"gin":  float64(g1[1]-g0[1]) / float64(n),
		}, nil
	}}
}

// goroutines returns each process's goroutine count.
func goroutines(ctx context.Context, cs ...*child) ([]int, error) {
	out := make([]int, len(cs))
	for i, c := range cs {
		var st struct{ Goroutines int }
		if err := c.callJSON(ctx, "stats", &st); err != nil {
			return nil, err
		}
		out[i] = st.Goroutines
	}
	return out, nil
}

// gcCycles returns the garbage collections the processes cs have
// completed so far, summed.
func gcCycles(ctx context.Context, cs ...*child) (uint64, error) {
	return statSum(ctx, "gc_cycles", cs...)
}

// statSum returns the figure key of the "stats" of each of cs, summed. A
// process whose stats lack it is an error, not a zero.
func statSum(ctx context.Context, key string, cs ...*child) (uint64, error) {
	var sum uint64
	for _, c := range cs {
		var st map[string]json.RawMessage
		if err := c.callJSON(ctx, "stats", &st); err != nil {
			return 0, err
		}
		var v uint64
		if err := json.Unmarshal(st[key], &v); err != nil {
			return 0, fmt.Errorf("%s stats %s: %w", c.name, key, err)
		}
		sum += v
	}
	return sum, nil
}

// schedOf asks each of cs for its "sched" figures since the previous ask
// and returns, for each figure, the largest of them.
func schedOf(ctx context.Context, cs ...*child) (map[string]float64, error) {
	out := map[string]float64{}
	for _, c := range cs {
		var m map[string]float64
		if err := c.callJSON(ctx, "sched", &m); err != nil {
			return nil, err
		}
		for k, v := range m {
			out[k] = max(out[k], v)
		}
	}
	return out, nil
}

// rssAfterGC collects garbage in each process, returns it to the OS, and
// reads the resident set sizes.
func rssAfterGC(ctx context.Context, cs ...*child) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		_, _ = c.call(ctx, "gc")
		out[i], _ = procRSS(c.pid())
	}
	return out
}

func runIdleMemory(ctx context.Context, e *env) ([]Result, error) {
	vs := []variant{
		e.idle("x/net pair", e.xnetPair, socksDial(e.plan.source(2), ap(e.plan.xnetOut, socksPort), ap(e.plan.server, appPort))),
		e.idle("gozt", func(ctx context.Context) (*child, *child, error) { return e.goztPair(ctx, nil, nil) }, e.goztDial(3, e.plan.server)),
	}
	s, err := e.measure(ctx, "idle-memory", vs, "out", "B/conn out")
	if err != nil {
		return nil, err
	}
	const t = "idle memory"
	n := s.count("gozt", "out")
	note := func(g string) string {
		return fmt.Sprintf("%d connections, each after one round trip; goroutines per connection: gozt %.1f, x/net %.1f",
			e.b.idleConns, s.median("gozt", g), s.median("x/net pair", g))
	}
	limit := Target{OnValue: true, Max: true, Bound: 8 << 10}
	return []Result{
		row(t, "outbound proxy, per connection", s.median("gozt", "out"), "B", n).vs("x/net pair", s.median("x/net pair", "out")).goal(limit).note(note("gout")),
		row(t, "inbound proxy, per connection", s.median("gozt", "in"), "B", n).vs("x/net pair", s.median("x/net pair", "in")).goal(limit).note(note("gin")),
	}, nil
}

// latency is a connection-latency variant: p50 of connect + 1 byte.
func (e *env) latency(name string, dial dialFunc) variant {
	return e.timed(name, e.b.connLat, connectLatencies, dial, 50)
}

const rbacPolicies = 10_000

// withPolicies runs "policies STATE" on c before each repetition of v.
func withPolicies(c *child, state string, v variant) variant {
	run := v.run
	v.run = func(ctx context.Context, warm bool) (map[string]float64, error) {
		if _, err := c.call(ctx, "policies "+state); err != nil {
			return nil, err
		}
		return run(ctx, warm)
	}
	return v
}

func runRBAC(ctx context.Context, e *env) ([]Result, error) {
	// One inbound process serves two workloads: one that 10,000 policies
	// apply to (a linear evaluator's worst case: every one matched on each
	// connection) and one in a namespace none of them applies to (the
	// common case). The baseline is the same process and workload with the
	// policies removed ("policies off" before each of its repetitions), so
	// no difference between processes shows up as policy cost.
	out, err := e.role(ctx, "gozt-out", "gozt", "--config", e.mesh, "--ca-dir", e.caDir, "--uids", clientUID)
	if err != nil {
		return nil, err
	}
	defer out.stop()
	inP, err := e.goztIn(ctx, "gozt-in-rbac", rbacUID+","+otherUID, "--policies", fmt.Sprint(rbacPolicies), "--policy-ns", rbacNS)
	if err != nil {
		return nil, err
	}
	defer inP.stop()
	var st struct {
		Policies            int
		InitialApplySeconds float64 `json:"initial_apply_seconds"`
	}
	if err := inP.callJSON(ctx, "stats", &st); err != nil {
		return nil, err
	}
	if st.Policies != rbacPolicies {
		return nil, fmt.Errorf("inbound proxy holds %d policies, want %d", st.Policies, rbacPolicies)
	}
	// Each row has its own baseline: the same workload with no policies.
	const (
		none, noneOther = "no policies", "no policies, other namespace"
		elsewhere       = "10,000 elsewhere"
		onPath          = "10,000 on the destination"
	)
	vs := []variant{
		withPolicies(inP, "off", e.latency(none, e.goztDial(1, e.plan.rbacSrv))),
		withPolicies(inP, "on", e.latency(onPath, e.goztDial(1, e.plan.rbacSrv))),
		withPolicies(inP, "off", e.latency(noneOther, e.goztDial(1, e.plan.other))),
		withPolicies(inP, "on", e.latency(elsewhere, e.goztDial(1, e.plan.other))),
	}
	s, err := e.measure(ctx, "rbac", vs, "p50", "µs p50")
	if err != nil {
		return nil, err
	}
	const t = "RBAC 10k policies"
	n := s.count(none, "p50")
	lt1 := Target{Max: true, Bound: 1.01}
	return []Result{
		row(t, "connection round trip p50, policies in another namespace", s.median(elsewhere, "p50"), "µs", n).vs(none, s.median(noneOther, "p50")).goal(lt1),
		row(t, "connection round trip p50, all applying to the destination", s.median(onPath, "p50"), "µs", n).vs(none, s.median(none, "p50")).goal(lt1).
			note("the worst case for a linear evaluator; gozt finds the candidates through its index"),
		row(t, "store update inserting 10,000 policies in one batch", st.InitialApplySeconds, "s", 1),
	}, nil
}

func runXDSPush(ctx context.Context, e *env) ([]Result, error) {
	// The fake istiod runs at the lowest priority, as a control plane on
	// another machine takes no CPU from the node (see xdsRole).
	x, err := e.role(ctx, "xds", "xds", "--ca-out", filepath.Join(e.tmp, "xds-ca.pem"), "--clients", "2", "--low-priority")
	if err != nil {
		return nil, err
	}
	defer x.stop()
	xdsArgs := []string{"--xds", x.info["addr"], "--xds-ca", x.info["ca"]}
	out, in, err := e.goztPair(ctx, xdsArgs, xdsArgs)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	s, err := e.measurePushes(ctx, "push", 2, x, out, in)
	if err != nil {
		return nil, err
	}
	stopAll([]*child{out, in})
	floor, err := e.pushFloor(ctx, x, xdsArgs)
	if err != nil {
		return nil, err
	}
	const t = "xDS push"
	n := s.count("push", "apply")
	w := fmt.Sprintf("%d workloads", e.b.workloads)
	return []Result{
		row(t, "apply time, push to last ACK ("+w+", 2 proxies)", s.median("push", "apply"), "s", n),
		row(t, "wire bytes per workload", s.median("push", "wire"), "B", n),
		row(t, "memory per workload per proxy", s.median("push", "mem"), "B", n).
			note("RSS after a collection, each push after the previous one's removal: the indexes' tables stay grown"),
		row(t, "memory per workload per proxy, first push into empty stores", s.median("push", "memall"), "B", s.count("push", "memall")).
			note("the indexes' tables included"),
		row(t, "garbage collections per proxy from the push to 0.5 s after its last ACK", s.median("push", "gcs"), "GCs", n),
		row(t, "longest stall of a live connection", s.median("push", "stall"), "ms", n).
			vs("same connection, before the push", s.median("push", "calm")).goal(Target{OnValue: true, Max: true, Bound: 5}).
			note("1-byte round trip every 1 ms, from the push to 0.5 s after its last ACK"),
		row(t, "longest stall of a live connection ÷ its longest before the push", s.median("push", "stallratio"), "×", n).
			goal(Target{OnValue: true, Max: true, Bound: 1.5}).
			note("each repetition's ratio: the push's window against the calm one before it, as long as the previous push's window"),
		row(t, "longest stop-the-world of a proxy in that window", s.median("push", "stw"), "ms", n),
		row(t, "longest wait of a proxy for the world to stop in that window", s.median("push", "stop"), "ms", n),
		row(t, "longest wait of a ready goroutine to run, in a proxy, in that window", s.median("push", "wait"), "ms", n),
		row(t, "longest stall of a live connection, the collector off in both proxies", floor.median(pushFloorName, "stall"), "ms",
			floor.count(pushFloorName, "stall")).vs("collector on", s.median("push", "stall")).
			note("the same push with GOGC=off: what the push costs here without any mark work"),
	}, nil
}

// measurePushes waits until the fake istiod has seen streams xDS streams
// opened in all (both proxies', and any replaced pair's before them) and
// measures the push variant name through out and in, watching a live
// connection from the probe.
func (e *env) measurePushes(ctx context.Context, name string, streams int, x, out, in *child) (samples, error) {
	if _, err := x.call(ctx, fmt.Sprintf("wait-clients %d", streams)); err != nil {
		return nil, err
	}
	var log *stallLog
	var err error
	if dir := e.opts.traceDir; dir != "" {
		if log, err = newStallLog(filepath.Join(dir, "xds-push-probe.stalls")); err != nil {
			return nil, err
		}
		defer log.close()
	}
	p, err := startProbe(ctx, e.goztDial(1, e.plan.server), time.Millisecond, log)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	return e.measure(ctx, "xds-push", []variant{e.push(name, x, out, in, p)}, "stall", "ms stall")
}

// pushFloorName names the push variant whose proxies run without a
// collector.
const pushFloorName = "push, no collector"

// pushFloor measures the push's stall again through a new pair of proxies
// that never collect garbage (GOGC=off, GOMEMLIMIT=off; the variant's own
// forced collections between pushes, outside the measured window, keep
// their memory bounded), for at most 3 repetitions: the stall a push costs
// on this machine with no mark work at all, the floor of any change to
// what the collector marks or when it runs. It fails if a proxy collected
// in the window anyway.
func (e *env) pushFloor(ctx context.Context, x *child, xdsArgs []string) (samples, error) {
	noGC := func(cmd *exec.Cmd) { cmd.Env = append(os.Environ(), "GOGC=off", "GOMEMLIMIT=off") }
	out, in, err := e.goztPairWith(ctx, "-nogc", noGC, xdsArgs, xdsArgs)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	reps := e.b.reps
	e.b.reps = min(reps, 3)
	defer func() { e.b.reps = reps }()
	s, err := e.measurePushes(ctx, pushFloorName, 4, x, out, in) // the first pair's 2 streams and these
	if err != nil {
		return nil, err
	}
	if gcs := s[pushFloorName]["gcs"]; slices.Max(gcs) > 0 {
		return nil, fmt.Errorf("proxies with GOGC=off collected in a push's window: %v per proxy", gcs)
	}
	return s, nil
}

// push is the xDS variant: watch the probe on a live HBONE connection over
// a window without a push, push new workloads to both proxies while it
// runs, then remove the workloads again.
//
// The stall window runs from the push until both proxies ACKed it and
// pushTail more, so that it also holds the collection that usually follows
// an applied push. The calm window comes before the push and is as long as
// the previous push's stall window (firstCalm before the first): the
// longest of a connection's round trips grows with the window it is taken
// over, so the two are compared over equal lengths.
func (e *env) push(name string, x, out, in *child, p *probe) variant {
	const (
		pushTail  = 500 * time.Millisecond
		firstCalm = 1500*time.Millisecond + pushTail
	)
	rep := 0
	calmFor := firstCalm
	// Both proxies' RSS before their first push (the warm-up's), while
	// their stores are empty: the first measured push is also reported
	// against it, so that its figure holds the indexes' tables, which a
	// later push finds already grown (maps do not shrink on removal).
	var rssEmpty []int64
	measured := false
	return variant{name, func(ctx context.Context, warm bool) (map[string]float64, error) {
		rep++
		n := e.b.workloads
		if warm {
			n /= 10
		}
		tag := fmt.Sprintf("r%d", rep)
		if _, err := x.call(ctx, fmt.Sprintf("prepare %d %s", n, tag)); err != nil {
			return nil, err
		}
		rss0 := rssAfterGC(ctx, out, in)
		if rssEmpty == nil {
			rssEmpty = rss0
		}
		first := !warm && !measured
		measured = measured || !warm
		gc0, err := gcCycles(ctx, out, in)
		if err != nil {
			return nil, err
		}
		p.reset()
		time.Sleep(calmFor)
		calm, _ := p.reset()
		pushed := time.Now() // the stall window starts with the reset
		// The proxies' sched figures are since the previous ask: this one
		// starts the push's window.
		if _, err := schedOf(ctx, out, in); err != nil {
			return nil, err
		}
		var res pushResult
		if err := x.callJSON(ctx, fmt.Sprintf("push %d %s", n, tag), &res); err != nil {
			return nil, err
		}
		time.Sleep(pushTail)
		stall, _ := p.reset()
		window := time.Since(pushed)
		sched, err := schedOf(ctx, out, in)
		if err != nil {
			return nil, err
		}
		gc1, err := gcCycles(ctx, out, in)
		if err != nil {
			return nil, err
		}
		if !res.Prepared {
			return nil, errors.New("xds role built the push inside the measured window")
		}
		if !warm {
			calmFor = window
		}
		if err := p.failure(); err != nil {
			return nil, err
		}
		rss1 := rssAfterGC(ctx, out, in)
		var st struct{ Workloads int }
		if err := out.callJSON(ctx, "stats", &st); err != nil {
			return nil, err
		}
		if st.Workloads < n {
			return nil, fmt.Errorf("outbound proxy holds %d workloads after a push of %d", st.Workloads, n)
		}
		if _, err := x.call(ctx, fmt.Sprintf("remove %d %s", n, tag)); err != nil {
			return nil, err
		}
		m := map[string]float64{
			"apply":      res.Seconds,
			"wire":       float64(res.WireBytes) / float64(n),
			"mem":        float64(rss1[0]-rss0[0]+rss1[1]-rss0[1]) / 2 / float64(n),
			"stall":      float64(stall) / float64(time.Millisecond),
			"gcs":        float64(gc1-gc0) / 2,
			"calm":       float64(calm) / float64(time.Millisecond),
			"stallratio": float64(stall) / float64(max(calm, time.Microsecond)),
			"stw":        max(sched["stw_total_max_ms"], sched["other_stw_total_max_ms"]),
			"stop":       sched["stw_stopping_max_ms"],
			"wait":       sched["runnable_max_ms"],
		}
		if first {
			m["memall"] = float64(rss1[0]-rssEmpty[0]+rss1[1]-rssEmpty[1]) / 2 / float64(n)
		}
		return m, nil
	}}
}
