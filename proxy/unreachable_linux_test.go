package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/tcptest"
	"github.com/gozt/gozt/internal/workers"
)

// TestDestinationUnreachable (TESTPLAN F25): an inbound CONNECT to a port
// whose SYNs a DROP rule swallows is answered 503 once the upstream connect
// times out (10 s, ztunnel's CONNECTION_TIMEOUT in src/proxy.rs), not
// before and not never; a sibling stream on the same HBONE connection flows
// meanwhile, and afterwards no connection, goroutine or tracked socket of
// the attempt is left. The workload lives on a veth end in a namespace
// of the test's, which also holds the DROP rule.
func TestDestinationUnreachable(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables")
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction(workers.IdleTop)) }) // first registered, so run last
	const ip = "10.9.8.3"
	ns := nstest.NewNetns(t)
	nstest.Run(t, "ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	nstest.Run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "v0")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v0", "up")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v1", "up")
	nstest.Run(t, "ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-p", "tcp", "-d", ip, "--dport", "9999", "-j", "DROP")
	inNetns := nstest.InNetnsPath("/run/netns/" + ns)

	var echoLn net.Listener
	if err := inNetns.Run(func() (err error) { echoLn, err = net.Listen("tcp", ip+":8080"); return err }); err != nil {
		t.Fatal(err)
	}
	// Its cleanup runs after the proxy's (started below), which closes the
	// upstream connections the echo handlers wait on.
	tcptest.Serve(t, echoLn, func(c net.Conn) { io.Copy(c, c) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, p := startInboundInNetns(t, ctx, ip, inNetns)
	sibling, err := cc.Connect(ctx, ip+":8080", nil)
	if err != nil {
		t.Fatalf("CONNECT to the open port: %v", err)
	}
	defer sibling.Close()
	sr := bufio.NewReader(sibling)
	echo := func(line string) {
		t.Helper()
		if _, err := io.WriteString(sibling, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if got, err := sr.ReadString('\n'); err != nil || got != line+"\n" {
			t.Fatalf("sibling echo of %q = %q, %v", line, got, err)
		}
	}
	echo("before")
	baseline := runtime.NumGoroutine()

	start := time.Now()
	blackholed := runAsyncErr(func() error {
		s, err := cc.Connect(ctx, ip+":9999", nil)
		if err == nil {
			s.Close()
		}
		return err
	})
	for i := range 5 {
		time.Sleep(time.Second)
		echo("while the connect hangs " + string(rune('0'+i)))
	}
	err = <-blackholed
	elapsed := time.Since(start)
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
		t.Fatalf("CONNECT to a blackholed port = %v after %v, want 503", err, elapsed)
	}
	t.Logf("CONNECT to a blackholed port answered %d after %v", se.Code, elapsed.Round(time.Millisecond))
	if elapsed < connectTimeout-time.Second {
		t.Errorf("503 after %v, before the %v connect timeout: not the timeout", elapsed, connectTimeout)
	}
	echo("after")

	// Resources freed: the attempt leaves nothing behind.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines 5s after the 503, %d before the attempt", runtime.NumGoroutine(), baseline)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.mu.Lock()
	tracked := len(p.conns)
	p.mu.Unlock()
	if tracked != 1 { // the HBONE connection itself
		t.Errorf("%d accepted connections tracked after the 503, want 1 (the HBONE connection)", tracked)
	}
}

// runAsyncErr runs f on a goroutine and delivers its error.
func runAsyncErr(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}
