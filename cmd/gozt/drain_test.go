package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/tcptest"
	xproxy "golang.org/x/net/proxy"
)

// The drain tests run the built binary's local mesh on 127.85.0.x with a
// plain TCP echo of the test's own as the server workload's application.
const (
	drainClientIP = "127.85.0.2"
	drainServerIP = "127.85.0.3"
	drainEchoAddr = drainServerIP + ":9000"
	drainAdmin    = "127.85.0.1"
)

const drainConfig = `
workloads:
- uid: Kubernetes//Pod/demo/client
  name: client
  namespace: demo
  serviceAccount: client
  workloadIps: [` + drainClientIP + `]
  protocol: HBONE
- uid: Kubernetes//Pod/demo/server
  name: server
  namespace: demo
  serviceAccount: server
  workloadIps: [` + drainServerIP + `]
  protocol: HBONE
`

// drainMesh is one running `gozt local` process.
type drainMesh struct{ *localProc }

// startDrainMesh starts `gozt local` on drainConfig with deadline as
// CONNECTION_TERMINATION_DEADLINE.
func startDrainMesh(t *testing.T, deadline time.Duration) *drainMesh {
	t.Helper()
	return &drainMesh{startLocal(t, drainConfig, drainAdmin,
		[]string{"CONNECTION_TERMINATION_DEADLINE=" + deadline.String(), "RUST_LOG=warn"})}
}

// echoLine writes line and reads it back.
func echoLine(c net.Conn, r *bufio.Reader, line string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return nil
}

type echoConn struct {
	net.Conn
	r *bufio.Reader
}

// hboneClient opens an mTLS HBONE connection to the server workload's
// 15008 with the client's identity, from the mesh's CA directory.
func (m *drainMesh) hboneClient(t *testing.T) *hbone.ClientConn {
	t.Helper()
	ca, err := localca.New(localca.Config{Dir: m.caDir})
	if err != nil {
		t.Fatal(err)
	}
	client := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	server := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "server"}
	cert, err := ca.Issue(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", drainServerIP+":15008")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{server.String()})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestDrainOnSIGTERM (SPEC §8.4): with 100 connections open through the
// mesh and one HBONE client connection, SIGTERM closes the listeners at
// once and sends the HBONE client GOAWAY, the open connections keep
// flowing until the drain deadline and are closed then, and the process
// exits 0.
func TestDrainOnSIGTERM(t *testing.T) {
	const deadline = 4 * time.Second
	tcptest.Echo(t, drainEchoAddr)
	m := startDrainMesh(t, deadline)

	socks, err := xproxy.SOCKS5("tcp", drainClientIP+":15080", nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]echoConn, 100)
	for i := range conns {
		c, err := socks.Dial("tcp", drainEchoAddr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer c.Close()
		conns[i] = echoConn{c, bufio.NewReader(c)}
		if err := echoLine(c, conns[i].r, fmt.Sprintf("before %d", i)); err != nil {
			t.Fatalf("connection %d before SIGTERM: %v", i, err)
		}
	}
	cc := m.hboneClient(t)
	stream, err := cc.Connect(context.Background(), drainEchoAddr, nil)
	if err != nil {
		t.Fatalf("HBONE CONNECT: %v", err)
	}
	defer stream.Close()
	sr := bufio.NewReader(stream)
	if err := echoLine(stream, sr, "hbone before"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Listeners close at once: a new SOCKS5 connection is refused (or
	// reset, when it landed in the accept queue as the listener closed).
	for {
		c, err := net.DialTimeout("tcp", drainClientIP+":15080", time.Second)
		if err != nil {
			if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("dial 15080 after SIGTERM: %v, want connection refused", err)
			}
			break
		}
		c.Close()
		if time.Since(start) > time.Second {
			t.Fatal("15080 still accepts 1s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The HBONE client got GOAWAY: no new stream, the open one flows.
	for cc.CanTakeNewStream() {
		if time.Since(start) > time.Second {
			t.Fatal("no GOAWAY on the HBONE connection 1s after SIGTERM")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := echoLine(stream, sr, "hbone during drain"); err != nil {
		t.Errorf("HBONE stream during drain: %v", err)
	}
	for i, c := range conns {
		if err := echoLine(c, c.r, fmt.Sprintf("during drain %d", i)); err != nil {
			t.Fatalf("connection %d during drain (%v after SIGTERM): %v", i, time.Since(start), err)
		}
	}
	if el := time.Since(start); el > deadline-time.Second {
		t.Fatalf("the drain checks took %v, too close to the %v deadline to mean anything", el, deadline)
	}
	// At the deadline every connection is closed and the process exits 0.
	select {
	case err := <-m.exited:
		m.exited <- err // for Cleanup
		if err != nil {
			t.Fatalf("gozt exited with %v after SIGTERM, want 0\nstderr:\n%s", err, &m.stderr)
		}
		if el := time.Since(start); el < deadline-500*time.Millisecond {
			t.Errorf("gozt exited %v after SIGTERM, before the %v deadline, with connections open", el, deadline)
		}
	case <-time.After(deadline + 5*time.Second):
		t.Fatalf("gozt still running %v after SIGTERM", deadline+5*time.Second)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.r.ReadByte(); err == nil {
			t.Errorf("connection %d read %q after exit, want it closed", i, n)
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("connection %d still open after exit", i)
		}
	}
	if strings.Contains(m.stderr.String(), "panic") {
		t.Errorf("gozt panicked:\n%s", &m.stderr)
	}
}

// TestSecondSignalExitsAtOnce: a SIGINT during the drain ends the process
// at once, open connections and all.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	tcptest.Echo(t, drainEchoAddr)
	m := startDrainMesh(t, time.Minute)
	socks, err := xproxy.SOCKS5("tcp", drainClientIP+":15080", nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	c, err := socks.Dial("tcp", drainEchoAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoLine(c, bufio.NewReader(c), "hello"); err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Wait until the drain has begun (the listener is gone), then SIGINT.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if c2, err := net.Dial("tcp", drainClientIP+":15080"); err != nil {
			break
		} else {
			c2.Close()
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("listener still open 2s after SIGTERM")
		}
	}
	start := time.Now()
	if err := m.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-m.exited:
		m.exited <- err
		t.Logf("exited %v after the second signal: %v", time.Since(start), err)
	case <-time.After(3 * time.Second):
		t.Fatalf("gozt still draining 3s after a second signal (deadline 1m)\nstderr:\n%s", &m.stderr)
	}
}
