package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/syncbuf"
	"github.com/gozt/gozt/internal/tcptest"
	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// The panic test's workload, on 127.86.1.0/24: one HBONE workload whose
// proxy serves SOCKS5 and inbound HBONE, and a plain echo outside the mesh.
const (
	panicWorkloadIP = "127.86.1.2"
	panicEchoIP     = "127.86.1.9"
)

// echoOnce writes a line to rw and requires it back within 5s.
func echoOnce(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil || got != line+"\n" {
		t.Fatalf("echo of %q = %q, %v", line, got, err)
	}
}

// panicCount reads gozt_connection_handler_panics_total{listener}.
func panicCount(t *testing.T, m *telemetry.Metrics, listener string) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Panics(listener).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

// TestHandlerPanicContained (TESTPLAN F26): a panic injected into one
// connection's handler, on the SOCKS5 listener and in one inbound CONNECT
// stream, closes that connection or stream only: a connection already
// flowing through the same proxy, and a sibling stream on the same HBONE
// connection, keep flowing, new connections succeed, the process lives,
// and gozt_connection_handler_panics_total counts each panic by listener.
func TestHandlerPanicContained(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction(workers.IdleTop)) }) // first registered, so run last
	// armed is the listener whose next handler panics, or "".
	var armed atomic.Value
	armed.Store("")
	SetHandlerHookForTest(t, func(listener string, c net.Conn) {
		if _, stream := c.(*tls.Conn); listener == "inbound" && !stream {
			return // the TLS connection's handler, not a CONNECT's
		}
		if armed.CompareAndSwap(listener, "") {
			panic(fmt.Sprintf("injected panic on %s", listener))
		}
	})

	echo, local, ca, id, store := oneWorkload(t, panicEchoIP, panicWorkloadIP)
	logs := &syncbuf.Buffer{}
	m := telemetry.NewMetrics(prometheus.NewRegistry())
	serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/w", BindAddr: netip.MustParseAddr(panicWorkloadIP), EnableSOCKS5: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}, 100*time.Millisecond)
	for _, name := range []string{"outbound", "plaintext", "inbound", "socks5"} {
		if got := panicCount(t, m, name); got != 0 {
			t.Errorf("panics{listener=%q} = %v at start, want 0", name, got)
		}
	}

	socks, err := xproxy.SOCKS5("tcp", panicWorkloadIP+":15080", nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := socks.Dial("tcp", echo)
		if err != nil {
			t.Fatalf("socks5 dial: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	flowing, fr := dial()
	echoOnce(t, flowing, fr, "before")

	// The SOCKS5 handler panics before it reads the greeting: the client's
	// handshake fails, promptly.
	armed.Store("socks5")
	if c, err := socks.Dial("tcp", echo); err == nil {
		c.Close()
		t.Fatal("socks5 dial through a panicking handler succeeded")
	}
	if a := armed.Load(); a != "" {
		t.Fatalf("the hook never fired for %v", a)
	}
	echoOnce(t, flowing, fr, "after socks5 panic")
	next, nr := dial()
	echoOnce(t, next, nr, "new connection")

	// An inbound CONNECT whose handler panics: that stream is reset, its
	// sibling on the same HBONE connection keeps flowing.
	cert, err := ca.Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc := dialHBONE(t, ctx, "", panicWorkloadIP+":15008", cert, id.String())
	sibling, err := cc.Connect(ctx, local, nil)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	defer sibling.Close()
	sr := bufio.NewReader(sibling)
	streamEcho := func(line string) {
		t.Helper()
		if _, err := io.WriteString(sibling, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if got, err := sr.ReadString('\n'); err != nil || got != line+"\n" {
			t.Fatalf("stream echo of %q = %q, %v", line, got, err)
		}
	}
	streamEcho("sibling before")
	armed.Store("inbound")
	if s, err := cc.Connect(ctx, local, nil); err == nil {
		s.Close()
		t.Fatal("CONNECT through a panicking handler succeeded")
	} else {
		t.Logf("CONNECT through a panicking handler: %v", err)
	}
	streamEcho("sibling after")
	echoOnce(t, flowing, fr, "after inbound panic")

	for name, want := range map[string]float64{"socks5": 1, "inbound": 1, "outbound": 0, "plaintext": 0} {
		if got := panicCount(t, m, name); got != want {
			t.Errorf("gozt_connection_handler_panics_total{listener=%q} = %v, want %v", name, got, want)
		}
	}
	if n := strings.Count(logs.String(), "connection handler panicked"); n != 2 {
		t.Errorf("%d panic log lines, want 2; logs:\n%s", n, logs)
	}
}

// oneWorkload is the fixture of the panic and admission tests: a line echo
// outside the mesh on echoIP, the workload's own application (another line
// echo) on workloadIP, a CA, the workload's identity ns/w, and a store
// holding that workload on workloadIP.
func oneWorkload(t *testing.T, echoIP, workloadIP string) (echo, local string, ca *localca.CA, id identity.Identity, store *state.Store) {
	t.Helper()
	echo = tcptest.Echo(t, echoIP+":0").String()
	local = tcptest.Echo(t, workloadIP+":0").String()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	id = identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "w"}
	store = state.NewStore(state.Config{})
	store.Update(func(b *state.Batch) {
		err = b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/w", Name: "w", Namespace: "ns", ServiceAccount: "w",
			TrustDomain: "cluster.local", Addresses: []netip.Addr{netip.MustParseAddr(workloadIP)}, Protocol: state.TunnelHBONE})
	})
	if err != nil {
		t.Fatal(err)
	}
	return echo, local, ca, id, store
}
