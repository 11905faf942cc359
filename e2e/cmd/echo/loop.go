package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// loop is `echo dial -every I -for D`: a new connection every I for D, all
// from one process, so that a client in a pod can probe a path many times a
// second with one exec.
type loop struct {
	addr  string
	msg   string        // each connection sends msg-SEQ
	every time.Duration // between connection starts
	dur   time.Duration // how long connections keep starting
	hold  time.Duration // each connection's wait before it half-closes
}

// attempt is one connection of a loop.
type attempt struct {
	seq   int
	start time.Time
	took  time.Duration
	err   error // nil: the echo came back whole, then EOF
}

// timeLayout is RFC 3339 with milliseconds, in UTC.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// run starts a connection every l.every while l.dur has not passed (the
// first at once), each on its own goroutine so that a slow one delays no other,
// waits for all of them, and writes the summary to out: one line
// "ok=N failed=M", then one line per failure, in start order, with its
// start time and error. It returns an error if any failed.
func (l loop) run(out io.Writer) error {
	var (
		mu       sync.Mutex
		attempts []attempt
		wg       sync.WaitGroup
	)
	start := time.Now()
	for seq := 0; ; seq++ {
		wg.Go(func() {
			a := l.try(seq)
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
		})
		next := time.Duration(seq+1) * l.every // on a fixed grid: no drift
		if next >= l.dur {
			break
		}
		time.Sleep(time.Until(start.Add(next)))
	}
	wg.Wait()
	return report(out, attempts)
}

// try makes connection seq: connect, send l.msg-seq, wait l.hold,
// half-close, read everything, and check it is the server's peer= line and
// then the message.
func (l loop) try(seq int) attempt {
	a := attempt{seq: seq, start: time.Now()}
	a.err = l.exchange(fmt.Sprintf("%s-%d", l.msg, seq))
	a.took = time.Since(a.start)
	return a
}

// exchange is one connection of try, sending sent.
func (l loop) exchange(sent string) error {
	c, err := net.DialTimeout("tcp", l.addr, dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(l.hold + ioTimeout))
	if _, err := io.WriteString(c, sent); err != nil {
		return err
	}
	time.Sleep(l.hold)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", len(got), err)
	}
	return checkEcho(string(got), sent)
}

// checkEcho reports how a reply differs from what `echo serve` answers to
// sent: a "peer=IP:PORT" line, then sent.
func checkEcho(got, sent string) error {
	line, rest, ok := strings.Cut(got, "\n")
	if !ok || !strings.HasPrefix(line, "peer=") {
		return fmt.Errorf("reply %q does not start with a peer= line", got)
	}
	if rest != sent {
		return fmt.Errorf("echo %q, want %q", rest, sent)
	}
	return nil
}

// report writes the summary of attempts to out and returns an error if any
// failed.
func report(out io.Writer, attempts []attempt) error {
	var failed []attempt
	for _, a := range attempts {
		if a.err != nil {
			failed = append(failed, a)
		}
	}
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "ok=%d failed=%d\n", len(attempts)-len(failed), len(failed))
	slices.SortFunc(failed, func(a, b attempt) int { return a.seq - b.seq })
	for _, a := range failed {
		fmt.Fprintf(w, "failed seq=%d at=%s after=%v: %v\n", a.seq, a.start.UTC().Format(timeLayout), a.took.Round(time.Millisecond), a.err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d connections failed", len(failed), len(attempts))
	}
	return nil
}
