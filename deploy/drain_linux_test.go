package deploy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/tcptest"
)

// TestChartGoztDrainsOnSIGTERM (SPEC §8.4) is the drain of the gozt process
// itself, run as Istio's chart runs it with terminationGracePeriodSeconds
// set to drainGrace, which the chart passes to gozt as
// TERMINATION_GRACE_PERIOD_SECONDS too: its drain deadline is then one
// second shorter (SPEC §0.3). After SIGTERM a stream opened before it
// still carries its half-close both ways (the application's answer to the
// client's FIN comes back, then the application's FIN), the stream still
// open at the deadline is closed, and gozt exits 0 at the deadline, before
// the kubelet would kill it at the end of the grace period.
func TestChartGoztDrainsOnSIGTERM(t *testing.T) {
	nstest.RequireRoot(t, "ip", "unshare", "setpriv", "mount", "sh")
	const (
		drainGrace = 8
		deadline   = (drainGrace - 1) * time.Second
		grace      = drainGrace * time.Second
	)
	ds := render(t, withValues(ourValues(t), map[string]any{"profile": "ambient", "terminationGracePeriodSeconds": drainGrace}))
	n := startNode(t, goztBinary(t), ds, 0)
	var lis net.Listener
	if err := nstest.InNetns(n.podPath, func() (err error) {
		lis, err = net.Listen("tcp", net.JoinHostPort(appIP, "8080"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	const trailer = "|eof" // the app's answer to its client's FIN
	tcptest.Serve(t, lis, func(c net.Conn) {
		if _, err := io.Copy(c, c); err == nil {
			io.WriteString(c, trailer)
		}
	})
	cc := dialPodHBONE(t, n.cp, n.podPath, n.p)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := cc.Connect(ctx, net.JoinHostPort(appIP, "8080"), nil)
	if err != nil {
		t.Fatalf("CONNECT: %v\n%s", err, n.p.logs())
	}
	defer held.Close()
	open, err := cc.Connect(ctx, net.JoinHostPort(appIP, "8080"), nil)
	if err != nil {
		t.Fatalf("CONNECT: %v\n%s", err, n.p.logs())
	}
	defer open.Close()
	const msg = "sent before SIGTERM"
	if _, err := io.WriteString(held, msg); err != nil {
		t.Fatal(err)
	}
	if err := echoOnce(open, "before SIGTERM"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := n.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for cc.CanTakeNewStream() {
		if time.Since(start) > time.Second {
			t.Fatalf("no GOAWAY 1s after SIGTERM\n%s", n.p.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := held.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	held.SetReadDeadline(time.Now().Add(2 * time.Second))
	if got, err := io.ReadAll(held); err != nil || string(got) != msg+trailer {
		t.Errorf("stream half-closed during the drain: read %q, %v; want %q and EOF", got, err, msg+trailer)
	}
	if err := echoOnce(open, "during the drain"); err != nil {
		t.Errorf("stream open during the drain: %v", err)
	}
	if el := time.Since(start); el > deadline-2*time.Second {
		t.Fatalf("the checks during the drain took %v, too close to the %v deadline to mean anything", el, deadline)
	}

	select {
	case <-n.p.exited:
		el := time.Since(start)
		if n.p.err != nil {
			t.Errorf("gozt exited with %v after SIGTERM, want status 0\n%s", n.p.err, n.p.logs())
		}
		if el < deadline-300*time.Millisecond {
			t.Errorf("gozt exited %v after SIGTERM, before its %v deadline, with a stream open", el, deadline)
		}
		t.Logf("gozt exited %v after SIGTERM (drain deadline %v, grace period %v)", el.Round(time.Millisecond), deadline, grace)
	case <-time.After(grace):
		t.Fatalf("gozt still running %v after SIGTERM, the end of its grace period (drain deadline %v)\n%s", grace, deadline, n.p.logs())
	}
	open.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("stream open at the deadline: read after gozt exited = %v, want it closed", err)
	}
}

// echoOnce writes line on s and reads it back, within 2 s.
func echoOnce(s net.Conn, line string) error {
	s.SetDeadline(time.Now().Add(2 * time.Second))
	defer s.SetDeadline(time.Time{})
	if _, err := io.WriteString(s, line); err != nil {
		return err
	}
	got := make([]byte, len(line))
	if _, err := io.ReadFull(s, got); err != nil {
		return err
	}
	if string(got) != line {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return nil
}
