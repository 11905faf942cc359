package sockopt_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/sockopt"
)

// dialWarmups are how many connections the benchmarked source address
// makes (and closes, leaving them in TIME_WAIT for 60 s) before the timed
// dials: the inbound proxy's upstream socket after a burst of connections
// from one client IP (issue 5: 10,000 from one client spent 97% of the
// proxy's CPU in bind). A bind to port 0 searches one parity of the
// ephemeral range first (half of the default 28,232 ports), so past about
// 14,000 sockets on one address every such bind scans thousands of ports.
var dialWarmups = []int{5000, 15000}

// sinkServer accepts connections, reads each to EOF and closes it, so the
// dialing side closes first and keeps the TIME_WAIT, as the inbound proxy's
// upstream socket does when its client leaves first.
type sinkServer struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newSinkServer(ln net.Listener) *sinkServer {
	s := &sinkServer{ln: ln}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

func (s *sinkServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			io.Copy(io.Discard, c)
			c.Close()
		}()
	}
}

// loopbackSink starts a sink server on 127.0.0.1, stopped when tb's test
// ends, and returns its address.
func loopbackSink(tb testing.TB) netip.AddrPort {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := newSinkServer(ln)
	tb.Cleanup(srv.close)
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// close stops the server and waits for its goroutines.
func (s *sinkServer) close() {
	s.ln.Close()
	s.wg.Wait()
}

func dialClose(d *net.Dialer, addr string) error {
	c, err := d.Dial("tcp4", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// randomLoopback returns a random address in 127.0.0.0/8 other than
// 127.0.0.1, local on every Linux host (lo's local route), so that each
// benchmark run starts with a source address no earlier run has used.
func randomLoopback() netip.Addr {
	for {
		a := netip.AddrFrom4([4]byte{127, byte(rand.IntN(256)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		if a != netip.MustParseAddr("127.0.0.1") {
			return a
		}
	}
}

// benchDialVs makes warmup connections to addr with d and as many with base
// (a dialer that binds no source), then times connect + close with d,
// interleaved with the same with base, and reports d's ns/op, base's
// unbound-ns/op and their ratio x-unbound: the figure that says whether
// binding a busy source address makes dialing slow. Both source addresses
// carry the same load, because what is left of a source address's 4-tuples
// to one server costs connect the same with or without a bind: over
// loopback, connect reuses TIME_WAIT 4-tuples (net.ipv4.tcp_tw_reuse=2, the
// default); elsewhere it scans past them, for bound and unbound sockets alike.
func benchDialVs(b *testing.B, warmup int, d, base *net.Dialer, addr string) error {
	for range warmup {
		if err := dialClose(d, addr); err != nil {
			return fmt.Errorf("warm-up dial from %v: %w", d.LocalAddr, err)
		}
		if err := dialClose(base, addr); err != nil {
			return fmt.Errorf("unbound warm-up dial: %w", err)
		}
	}
	var took, baseTook time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := dialClose(d, addr); err != nil {
			return fmt.Errorf("dial from %v: %w", d.LocalAddr, err)
		}
		t1 := time.Now()
		if err := dialClose(base, addr); err != nil {
			return fmt.Errorf("unbound dial: %w", err)
		}
		took += t1.Sub(t0)
		baseTook += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(took.Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(baseTook.Nanoseconds())/n, "unbound-ns/op")
	b.ReportMetric(float64(took)/float64(baseTook), "x-unbound")
	return nil
}

// BenchmarkDialSpoofedSource times Dialer(src) connecting from one source
// address that has just made 5,000 or 15,000 connections to the same
// server, against an unbound dial (after as many) measured alternately in
// the same loop (the x-unbound metric; close to 1 means binding the source
// costs nothing):
//
//   - local-source: src is a 127/8 address (IsLocal; plain bind). Runs
//     anywhere.
//   - nonlocal-source: src is an address no interface has, spoofed with
//     IP_TRANSPARENT across a veth pair with istio-cni's routing. Needs root.
//
// Run it with a fixed count, e.g. -benchtime 5000x: every dial leaves a
// TIME_WAIT socket on the source address for 60 s, and the ephemeral range
// holds only 28,232 of them.
func BenchmarkDialSpoofedSource(b *testing.B) {
	for _, warmup := range dialWarmups {
		b.Run(fmt.Sprintf("local-source/after-%d", warmup), func(b *testing.B) {
			benchDialLocal(b, warmup)
		})
	}
	for _, warmup := range dialWarmups {
		b.Run(fmt.Sprintf("nonlocal-source/after-%d", warmup), func(b *testing.B) {
			benchDialNonlocal(b, warmup)
		})
	}
}

func benchDialLocal(b *testing.B, warmup int) {
	addr := loopbackSink(b)
	d := sockopt.Dialer(randomLoopback(), sockopt.Options{})
	base := sockopt.Dialer(netip.Addr{}, sockopt.Options{})
	if err := benchDialVs(b, warmup, d, base, addr.String()); err != nil {
		b.Fatal(err)
	}
}

func benchDialNonlocal(b *testing.B, warmup int) {
	nstest.RequireRoot(b, "ip", "iptables")
	proxy, server := newSpoofPair(b)
	var ln net.Listener
	server.in(b, func() (err error) {
		ln, err = net.Listen("tcp4", "10.99.2.2:0")
		return err
	})
	srv := newSinkServer(ln)
	defer srv.close()
	d := sockopt.Dialer(netip.MustParseAddr("10.99.0.5"), sockopt.Options{Mark: spoofMark})
	base := sockopt.Dialer(netip.Addr{}, sockopt.Options{Mark: spoofMark})
	// The whole loop runs in the proxy netns: InNetns per dial would cost
	// more than the dial.
	proxy.in(b, func() error { return benchDialVs(b, warmup, d, base, ln.Addr().String()) })
}

// BenchmarkDialUnbound times connect + close with a Dialer that binds no
// source address, the baseline of BenchmarkDialSpoofedSource.
func BenchmarkDialUnbound(b *testing.B) {
	addr := loopbackSink(b).String()
	d := sockopt.Dialer(netip.Addr{}, sockopt.Options{})
	for b.Loop() {
		if err := dialClose(d, addr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIsLocal times IsLocal on a fresh loopback address and on ones
// that have just made 5,000 or 15,000 connections (whose TIME_WAIT sockets
// a port-allocating bind has to search past).
func BenchmarkIsLocal(b *testing.B) {
	for _, warmup := range append([]int{0}, dialWarmups...) {
		b.Run(fmt.Sprintf("after-%d", warmup), func(b *testing.B) {
			src := randomLoopback()
			if warmup > 0 {
				addr := loopbackSink(b).String()
				d := sockopt.Dialer(src, sockopt.Options{})
				for range warmup {
					if err := dialClose(d, addr); err != nil {
						b.Fatal(err)
					}
				}
			}
			for b.Loop() {
				if !sockopt.IsLocal(src) {
					b.Fatalf("IsLocal(%v) = false", src)
				}
			}
		})
	}
}

// BenchmarkDialLoopback times connect + close of sockopt.Dial from a source
// address, with the keep-alive settings the proxy uses, against the same
// Dialer's own net.Dialer.DialTCP, measured alternately in one loop (each
// pair in turn order, so that neither always follows the other): wall time
// and the process's CPU (user and system, the server's share included) per
// dial for each, and their ratios x-net and cpu-x-net. On loopback the
// handshake is over when connect(2) returns, and net.Dialer still parks the
// goroutine to wait for writability; Dial connects in Control and asks the
// socket first.
func BenchmarkDialLoopback(b *testing.B) {
	dst := loopbackSink(b)
	opts := sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}}
	// Two fresh source addresses, so that neither's TIME_WAIT sockets slow
	// the other's connects.
	dials := [2]func() (*net.TCPConn, error){}
	{
		d := sockopt.Dialer(randomLoopback(), opts)
		dials[0] = func() (*net.TCPConn, error) { return sockopt.Dial(context.Background(), d, dst) }
	}
	{
		d := sockopt.Dialer(randomLoopback(), opts)
		la := d.LocalAddr.(*net.TCPAddr).AddrPort()
		dials[1] = func() (*net.TCPConn, error) { return d.DialTCP(context.Background(), "tcp", la, dst) }
	}
	took, cpu, n := interleaveDials(b, dials)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "ns/dial")
	b.ReportMetric(float64(took[1].Nanoseconds())/n, "net-ns/dial")
	b.ReportMetric(float64(cpu[0].Nanoseconds())/n, "cpu-ns/dial")
	b.ReportMetric(float64(cpu[1].Nanoseconds())/n, "net-cpu-ns/dial")
	b.ReportMetric(float64(took[0])/float64(took[1]), "x-net")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "cpu-x-net")
}

// interleaveDials runs b's loop over the two dials, alternating which goes
// first, closing each connection, and returns each dial's total wall and
// process CPU time and the number of turns.
func interleaveDials(b *testing.B, dials [2]func() (*net.TCPConn, error)) (took, cpu [2]time.Duration, n float64) {
	turn := 0
	for b.Loop() {
		turn++
		for k := range 2 {
			i := (k + turn) % 2
			c0, t0 := processCPU(b), time.Now()
			c, err := dials[i]()
			if err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(t0)
			c.Close()
			cpu[i] += processCPU(b) - c0
		}
	}
	return took, cpu, float64(turn)
}

// processCPU returns the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDialInNetns measures a shared-mode dial, DialInNetns into a
// network namespace of its own to a listener on that namespace's loopback
// (as an inbound proxy dials its pod's workload), interleaved with Dial
// from the process's own namespace to its loopback: "x-dial" and
// "cpu-x-dial" are what entering and leaving the namespace cost on top.
func BenchmarkDialInNetns(b *testing.B) {
	nstest.RequireRoot(b, "ip")
	ns := newNetns(b)
	ns.exec(b, "ip", "link", "set", "lo", "up")
	enter := ns.enterFunc(b)
	var inside net.Listener
	ns.in(b, func() (err error) { inside, err = net.Listen("tcp4", "127.0.0.1:0"); return err })
	b.Cleanup(newSinkServer(inside).close)
	opts := sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}}
	d := sockopt.Dialer(netip.Addr{}, opts)
	nsDst, dst := inside.Addr().(*net.TCPAddr).AddrPort(), loopbackSink(b)
	dials := [2]func() (*net.TCPConn, error){
		func() (*net.TCPConn, error) { return sockopt.DialInNetns(context.Background(), enter, d, nsDst) },
		func() (*net.TCPConn, error) { return sockopt.Dial(context.Background(), d, dst) },
	}
	took, cpu, n := interleaveDials(b, dials)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "ns/dial")
	b.ReportMetric(float64(cpu[0].Nanoseconds())/n, "cpu-ns/dial")
	b.ReportMetric(float64(took[0])/float64(took[1]), "x-dial")
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "cpu-x-dial")
}

// BenchmarkDialAllocs dials as the inbound proxy does for each connection
// (a Dialer built for the connection's source, ztunnel's keep-alive, the
// 10 s connect timeout) and reports the allocations per dial, the test's
// accept loop included.
func BenchmarkDialAllocs(b *testing.B) {
	dst := loopbackSink(b)
	src := randomLoopback()
	opts := sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}}
	b.ReportAllocs()
	for b.Loop() {
		d := sockopt.Dialer(src, opts)
		d.Timeout = 10 * time.Second
		c, err := sockopt.Dial(context.Background(), d, dst)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
