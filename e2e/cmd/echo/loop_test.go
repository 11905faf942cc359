package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// listen serves handle on a loopback listener until the test ends and
// returns its address.
func listen(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { handle(c) })
		}
	})
	return ln.Addr().String()
}

// serveLocal runs `echo serve`'s accept loop on a loopback listener until
// the test ends and returns its address.
func serveLocal(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { serveOn(ln); close(done) }()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestDialLoop: `echo dial -every 20ms -for 400ms` against `echo serve`
// opens 20 connections on schedule, each echoed whole with its own
// sequence number: one summary line, exit status 0.
func TestDialLoop(t *testing.T) {
	addr := serveLocal(t)
	var out bytes.Buffer
	start := time.Now()
	err := dial([]string{"-every", "20ms", "-for", "400ms", addr, "probe"}, &out)
	took := time.Since(start)
	if err != nil {
		t.Errorf("dial loop = %v, want nil\n%s", err, &out)
	}
	if got, want := out.String(), "ok=20 failed=0\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	if took < 370*time.Millisecond || took > 5*time.Second {
		t.Errorf("the loop took %v, want about 400ms", took)
	}
}

// TestDialLoopFailures: connections the server mishandles are each
// reported with their start time (RFC 3339, milliseconds) and error, after
// the summary line, and the loop exits non-zero.
func TestDialLoopFailures(t *testing.T) {
	addr := listen(t, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		_, seq, _ := strings.Cut(string(buf[:n]), "-")
		switch seq {
		case "1": // reset before answering
			c.(*net.TCPConn).SetLinger(0)
			return
		case "3": // a wrong echo
			io.Copy(io.Discard, c)
			fmt.Fprintf(c, "peer=%v\nsomething else", c.RemoteAddr())
			return
		}
		fmt.Fprintf(c, "peer=%v\n", c.RemoteAddr())
		c.Write(buf[:n])
		io.Copy(c, c)
	})
	var out bytes.Buffer
	start := time.Now().UTC().Truncate(time.Millisecond)
	err := dial([]string{"-every", "30ms", "-for", "150ms", addr, "m"}, &out)
	end := time.Now()
	if err == nil || !strings.Contains(err.Error(), "2 of 5") {
		t.Errorf("dial loop = %v, want an error counting 2 of 5 failed", err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 || lines[0] != "ok=3 failed=2" {
		t.Fatalf("output:\n%s\nwant the summary ok=3 failed=2 and two failures", &out)
	}
	failure := regexp.MustCompile(`^failed seq=(\d+) at=(\S+) after=\S+: (.+)$`)
	for i, want := range []struct{ seq, err string }{{"1", ""}, {"3", `echo "something else", want "m-3"`}} {
		m := failure.FindStringSubmatch(lines[1+i])
		if m == nil {
			t.Errorf("failure line %q does not match %v", lines[1+i], failure)
			continue
		}
		if m[1] != want.seq || !strings.Contains(m[3], want.err) {
			t.Errorf("failure line %q, want seq=%s and an error with %q", lines[1+i], want.seq, want.err)
		}
		at, err := time.Parse(timeLayout, m[2])
		if err != nil || !strings.HasSuffix(m[2], "Z") || len(m[2]) != len("2006-01-02T15:04:05.000Z") {
			t.Errorf("failure time %q: %v; want RFC 3339 with milliseconds, UTC", m[2], err)
			continue
		}
		if n, _ := strconv.Atoi(want.seq); at.Before(start.Add(time.Duration(n)*30*time.Millisecond)) || at.After(end) {
			t.Errorf("failure seq=%s at %v, outside its slot of the run (%v to %v)", want.seq, at, start, end)
		}
	}
}

// TestDialFlags: -every and -for go together; the one-connection dial
// prints what came back, as before.
func TestDialFlags(t *testing.T) {
	addr := serveLocal(t)
	for _, args := range [][]string{
		{"-every", "10ms", addr},
		{"-for", "1s", addr},
		{"-every", "-1s", "-for", "1s", addr},
	} {
		if err := dial(args, io.Discard); err == nil {
			t.Errorf("dial %q = nil, want an error", args)
		}
	}
	var out bytes.Buffer
	if err := dial([]string{addr, "once"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := checkEcho(out.String(), "once"); err != nil {
		t.Errorf("dial printed %q: %v", &out, err)
	}
}
