package bench

import (
	"context"
	"fmt"
	"os"
)

// The shared-mode scenario (issue 9, "Measure it"): the same proxies as
// dedicated mode, but with every listener and every upstream socket made
// inside a pod's network namespace, as `gozt proxy` does for the pods
// istio-cni hands it.
//
// Topology. Each shared-mode gozt process starts in a network namespace of
// its own (CLONE_NEWNET: a loopback interface that is down and nothing
// else, as ztunnel's own pod holds none of the pods' addresses) and is given
// the harness's namespace as its pod's (--netns /proc/<harness>/ns/net).
// So every socket it makes goes through proxy.Config.InNetns =
// netns.Handle.Run; one made without it would land in the empty namespace
// and reach nothing. The pods' sockets bind loopback addresses of their own
// (plan.sharedClient, plan.sharedServer) in the namespace the harness's
// clients and the test server use, so the traffic takes the same loopback
// path as in dedicated mode and the ratios isolate the cost of entering a
// namespace per socket. Nothing is created on the host: the namespaces
// live as long as their processes.

const sharedTitle = "shared mode"

// sharedPair starts the outbound and inbound gozt processes of the shared
// workloads, each in a network namespace of its own with the harness's as
// its pod namespace.
func (e *env) sharedPair(ctx context.Context) (out, in *child, err error) {
	pod := fmt.Sprintf("/proc/%d/ns/net", os.Getpid())
	start := func(label, uid string) (*child, error) {
		c, err := e.roleWith(ctx, label, "gozt", ownNetns, "--config", e.mesh, "--ca-dir", e.caDir, "--uids", uid, "--netns", pod)
		if err != nil {
			return nil, err
		}
		if err := checkOwnNetns(c); err != nil {
			c.stop()
			return nil, err
		}
		return c, nil
	}
	if out, err = start("gozt-shared-out", sharedClientUID); err != nil {
		return nil, nil, err
	}
	if in, err = start("gozt-shared-in", sharedServerUID); err != nil {
		out.stop()
		return nil, nil, err
	}
	return out, in, nil
}

// checkOwnNetns returns an error unless c runs in another network namespace
// than the harness.
func checkOwnNetns(c *child) error {
	self, err := netnsInode(os.Getpid())
	if err != nil {
		return err
	}
	ino, err := netnsInode(c.pid())
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	if ino == self {
		return fmt.Errorf("%s runs in the harness's network namespace, want one of its own", c.name)
	}
	return nil
}

// sharedDial reaches the shared server workload through the shared
// outbound proxy's SOCKS5 port, from source i.
func (e *env) sharedDial(i int) dialFunc {
	return socksDial(e.plan.source(i), ap(e.plan.sharedClient, socksPort), ap(e.plan.sharedServer, appPort))
}

func runShared(ctx context.Context, e *env) ([]Result, error) {
	if err := netnsUnavailable(); err != nil {
		msg := "shared: skipped, " + err.Error()
		fmt.Fprintln(e.stderr, msg)
		e.notes = append(e.notes, msg)
		return nil, nil
	}
	rs, err := e.sharedTraffic(ctx)
	if err != nil {
		return nil, err
	}
	idle, err := e.sharedIdle(ctx)
	if err != nil {
		return nil, err
	}
	return append(rs, idle...), nil
}

// sharedTraffic measures the connect rate and 1-stream HBONE upload of a
// dedicated and a shared pair running side by side.
func (e *env) sharedTraffic(ctx context.Context) ([]Result, error) {
	out, in, err := e.goztPair(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{out, in})
	sout, sin, err := e.sharedPair(ctx)
	if err != nil {
		return nil, err
	}
	defer stopAll([]*child{sout, sin})
	const ded, shr = "dedicated mode", "shared"
	c, err := e.measure(ctx, "shared", []variant{
		e.rate(ded, e.goztDial(1, e.plan.server), out, in),
		e.rate(shr, e.sharedDial(1), sout, sin),
	}, "rate", "conn/s")
	if err != nil {
		return nil, err
	}
	b, err := e.measure(ctx, "shared", []variant{
		e.bulk(ded, e.goztDial(2, e.plan.server), upload, out, in),
		e.bulk(shr, e.sharedDial(2), upload, sout, sin),
	}, "throughput", "MB/s")
	if err != nil {
		return nil, err
	}
	m := fmt.Sprintf("connect + 1 byte + close, pooled, %d clients", e.b.workers)
	nc, nb := c.count(shr, "rate"), b.count(shr, "throughput")
	return []Result{
		row(sharedTitle, m, c.median(shr, "rate"), "conn/s", nc).vs(ded, c.median(ded, "rate")).goal(Target{Bound: 0.9}).
			note("every upstream socket made in the pod's network namespace"),
		row(sharedTitle, "proxy CPU per connection, both proxies", c.median(shr, "cpu"), "µs", nc).vs(ded, c.median(ded, "cpu")),
		row(sharedTitle, "proxy CPU per connection, inbound proxy", c.median(shr, "cpu1"), "µs", nc).vs(ded, c.median(ded, "cpu1")).
			note("the one that dials a socket per connection"),
		row(sharedTitle, "HBONE upload, 1 stream", b.median(shr, "throughput"), "MB/s", nb).vs(ded, b.median(ded, "throughput")),
		row(sharedTitle, "HBONE upload, CPU per GB, both proxies", b.median(shr, "cpu"), "CPU-s/GB", nb).vs(ded, b.median(ded, "cpu")),
	}, nil
}

// sharedIdle measures idle memory per connection, each run on a fresh
// dedicated or shared pair.
func (e *env) sharedIdle(ctx context.Context) ([]Result, error) {
	const ded, shr = "dedicated mode", "shared"
	dedPair := func(ctx context.Context) (*child, *child, error) { return e.goztPair(ctx, nil, nil) }
	s, err := e.measure(ctx, "shared", []variant{
		e.idle(ded, dedPair, e.goztDial(3, e.plan.server)),
		e.idle(shr, e.sharedPair, e.sharedDial(3)),
	}, "out", "B/conn out")
	if err != nil {
		return nil, err
	}
	n := s.count(shr, "out")
	note := fmt.Sprintf("%d connections, each after one round trip", e.b.idleConns)
	return []Result{
		row(sharedTitle, "idle memory, outbound proxy, per connection", s.median(shr, "out"), "B", n).vs(ded, s.median(ded, "out")).note(note),
		row(sharedTitle, "idle memory, inbound proxy, per connection", s.median(shr, "in"), "B", n).vs(ded, s.median(ded, "in")).note(note),
	}, nil
}
