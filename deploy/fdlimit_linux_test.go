package deploy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/internal/tcptest"
)

// TestChartGoztAtTheDescriptorLimit (TESTPLAN F21, in shared mode): gozt
// run as Istio's chart runs it, under a low open-file limit (fdLimitShared,
// soft and hard), serves a pod. HBONE streams to
// the pod's application are opened on one connection, each taking one of
// gozt's descriptors for its upstream socket, made in the pod's namespace,
// until the limit, every free descriptor serving a stream: the streams
// past it are answered at once (a status or a reset, not a wait), a new
// connection to the pod's 15008 is shed, the streams already open keep
// carrying bytes, gozt keeps running, and once the streams close new ones
// succeed again.
func TestChartGoztAtTheDescriptorLimit(t *testing.T) {
	nstest.RequireRoot(t, "ip", "unshare", "setpriv", "mount", "sh")
	n := startNode(t, goztBinary(t), render(t, withValues(ourValues(t), map[string]any{"profile": "ambient"})), fdLimitShared)
	pid := n.p.cmd.Process.Pid

	var lis net.Listener
	if err := nstest.InNetns(n.podPath, func() (err error) {
		lis, err = net.Listen("tcp", net.JoinHostPort(appIP, "8080"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tcptest.Serve(t, lis, func(c net.Conn) { io.Copy(c, c) })
	cc := dialPodHBONE(t, n.cp, n.podPath, n.p)
	defer cc.Close()

	type stream struct {
		s io.ReadWriteCloser
		r *bufio.Reader
	}
	echo := func(st stream, line string) error {
		if _, err := io.WriteString(st.s, line+"\n"); err != nil {
			return err
		}
		got, err := st.r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != line+"\n" {
			return fmt.Errorf("echo %q, want %q", got, line)
		}
		return nil
	}
	open := func(i int) (stream, time.Duration, error) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := cc.Connect(ctx, net.JoinHostPort(appIP, "8080"), nil)
		if err != nil {
			return stream{}, time.Since(start), err
		}
		st := stream{s: s, r: bufio.NewReader(s)}
		if err := echo(st, fmt.Sprintf("stream %d", i)); err != nil {
			s.Close()
			return stream{}, time.Since(start), err
		}
		return st, time.Since(start), nil
	}

	// A few streams first, then the limit: what gozt holds now, plus 12.
	// gozt's epoll sets before them: the runtime's, and the one where the
	// pod's idle listeners park (proxy/sockwait).
	sets := countFDs(proctest.FDs(t, pid), "anon_inode:[eventpoll]")
	var streams []stream
	defer func() {
		for _, st := range streams {
			st.s.Close()
		}
	}()
	for i := range 3 {
		st, _, err := open(i)
		if err != nil {
			t.Fatalf("stream %d before the limit: %v\n%s", i, err, n.p.logs())
		}
		streams = append(streams, st)
	}
	// The three streams go idle and park in the inbound's relay Poller,
	// which parks in that same Set: no epoll set of its own, which would
	// take one of the free descriptors counted below at the first park.
	time.Sleep(200 * time.Millisecond) // well past the relay's wait before a park
	if got := countFDs(proctest.FDs(t, pid), "anon_inode:[eventpoll]"); got != sets {
		t.Fatalf("gozt has %d epoll sets once its streams idle, want the %d it had: %v", got, sets, proctest.FDs(t, pid))
	}
	held := slotsHeld(t, pid)
	if got := proctest.OpenFileLimit(t, pid); got != fdLimitShared {
		t.Fatalf("gozt's open-file limit is %d, want %d", got, fdLimitShared)
	}
	headroom := fdLimitShared - held
	if headroom < 8 {
		t.Fatalf("gozt holds %d descriptors of its limit of %d at start", held, fdLimitShared)
	}
	refused, slowest, firstRefusal := 0, time.Duration(0), error(nil)
	for i := 3; i < 3+3*headroom && refused < 5; i++ {
		st, took, err := open(i)
		if err == nil {
			streams = append(streams, st)
			continue
		}
		slowest = max(slowest, took)
		var se *hbone.StatusError
		var re *hbone.ResetError
		if !errors.As(err, &se) && !errors.As(err, &re) {
			t.Fatalf("stream %d at the limit: %v (%T), want a status or a reset\n%s", i, err, err, n.p.logs())
		}
		if refused == 0 {
			firstRefusal = err
		}
		refused++
	}
	opened := len(streams) - 3
	t.Logf("%d descriptors held, limit %d: %d more streams opened, then %d refused (%v; slowest answer %v); gozt holds %d",
		held, fdLimitShared, opened, refused, firstRefusal, slowest.Round(time.Millisecond), slotsHeld(t, pid))
	if refused == 0 {
		t.Fatalf("%d streams opened under a limit of %d more descriptors, none refused: the test proves nothing", opened, headroom)
	}
	// Each stream's upstream socket is one descriptor, the last free one
	// included (a dial that duplicated its socket would fail there).
	if opened != headroom {
		t.Errorf("%d streams opened with %d descriptors free, want one each", opened, headroom)
	}
	if slowest > 3*time.Second {
		t.Errorf("a stream at the limit waited %v for its answer, want a prompt refusal", slowest)
	}
	// A new connection to the pod's 15008 has no descriptor to be accepted
	// with: gozt's accept loop sheds it (a reset or an end), not a wait in
	// the accept queue.
	for i := range 3 {
		var c net.Conn
		if err := nstest.InNetns(n.podPath, func() (err error) {
			c, err = net.DialTimeout("tcp", net.JoinHostPort(appIP, "15008"), 2*time.Second)
			return err
		}); err != nil {
			continue // refused outright: as good
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("\x16\x03\x01")) // a TLS record's start; gozt never reads it
		_, err := c.Read(make([]byte, 1))
		c.Close()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("new connection %d to 15008 at the limit: read %v, want it shed (a reset or EOF)", i, err)
		}
	}
	for i, st := range streams {
		if err := echo(st, fmt.Sprintf("still %d", i)); err != nil {
			t.Fatalf("open stream %d at the limit: %v", i, err)
		}
	}
	select {
	case <-n.p.exited:
		t.Fatalf("gozt exited at the descriptor limit: %v\n%s", n.p.err, n.p.logs())
	default:
	}

	// Recovery: the streams close, their upstream sockets with them, and a
	// new stream is served.
	for _, st := range streams {
		st.s.Close()
	}
	streams = nil
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _, err := open(1000)
		if err == nil {
			streams = append(streams, st)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new stream 10s after the others closed: %v\n%s", err, n.p.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fdLimitShared is gozt's RLIMIT_NOFILE in TestChartGoztAtTheDescriptorLimit.
const fdLimitShared = 96

// slotsHeld returns how many of the descriptor numbers below fdLimitShared
// process pid holds. A descriptor numbered above the limit, inherited from
// the test's own parent (a CI runner's pipe, say), takes none of them: the
// kernel gives each new descriptor the lowest free number, and fails only
// when every number below the limit is taken.
func slotsHeld(t *testing.T, pid int) int {
	n := 0
	for fd := range proctest.FDs(t, pid) {
		if fd < fdLimitShared {
			n++
		}
	}
	return n
}

// countFDs counts the descriptors in fds that refer to target.
func countFDs(fds map[int]string, target string) int {
	n := 0
	for _, tg := range fds {
		if tg == target {
			n++
		}
	}
	return n
}
