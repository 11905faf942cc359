package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a process the harness started: a role of this same executable
// (spoken to over its stdin and stdout, one line per command and reply) or
// an external program such as haproxy.
//
// Invariants:
//   - done is closed once cmd.Wait has returned, so the process is reaped.
//   - Replies arrive on lines in the order commands were sent; mu keeps one
//     command in flight.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // nil for external programs
	lines  chan string
	stderr *tailBuffer
	done   chan struct{}
	info   map[string]string // the role's ready line

	mu sync.Mutex // serializes call
}

const (
	readyTimeout = 60 * time.Second // role start, generous for -race builds
	callTimeout  = 2 * time.Minute  // the longest command is an xDS push
	stopTimeout  = 5 * time.Second
)

// startRole runs `exe bench --role role args...` and waits for its ready
// line. setup, if non-nil, adjusts the command before it starts.
func startRole(ctx context.Context, exe, role string, args []string, setup func(*exec.Cmd)) (*child, error) {
	cmd := exec.Command(exe, append([]string{"bench", "--role", role}, args...)...)
	c := newChild(role, cmd)
	if setup != nil {
		setup(cmd)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	c.stdin = stdin
	if err := c.start(); err != nil {
		return nil, err
	}
	line, err := c.next(ctx, readyTimeout)
	if err == nil {
		payload, ok := strings.CutPrefix(line, "ready ")
		if !ok {
			err = fmt.Errorf("unexpected first line %q", line)
		} else if err = json.Unmarshal([]byte(payload), &c.info); err != nil {
			err = fmt.Errorf("ready line %q: %w", line, err)
		}
	}
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("start %s: %w%s", role, err, c.stderr.context())
	}
	return c, nil
}

// startProgram runs an external program; ready reports when it serves.
func startProgram(ctx context.Context, name string, path string, args []string, ready func(context.Context) error) (*child, error) {
	c := newChild(name, exec.Command(path, args...))
	if err := c.start(); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		err := ready(rctx)
		if err == nil {
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("start %s: exited: %v%s", name, c.cmd.ProcessState, c.stderr.context())
		case <-rctx.Done():
			c.stop()
			return nil, fmt.Errorf("start %s: not ready: %w%s", name, err, c.stderr.context())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func newChild(name string, cmd *exec.Cmd) *child {
	c := &child{name: name, cmd: cmd, lines: make(chan string, 16), stderr: &tailBuffer{max: 8 << 10}, done: make(chan struct{})}
	cmd.Stdout = &lineWriter{out: c.lines}
	cmd.Stderr = c.stderr
	isolate(cmd)
	return c
}

func (c *child) start() error {
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	return nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// next returns the next line the child printed.
func (c *child) next(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-c.lines:
		return l, nil
	case <-c.done:
		// A line may have been queued just before the exit.
		select {
		case l := <-c.lines:
			return l, nil
		default:
		}
		return "", fmt.Errorf("%s exited: %v", c.name, c.cmd.ProcessState)
	case <-t.C:
		return "", fmt.Errorf("%s: no answer within %v", c.name, timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// call sends one command line and returns the reply's payload ("ok
// PAYLOAD"); a reply "err MESSAGE" becomes an error.
func (c *child) call(ctx context.Context, command string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
		return "", fmt.Errorf("%s %s: %w%s", c.name, command, err, c.stderr.context())
	}
	line, err := c.next(ctx, callTimeout)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w%s", c.name, command, err, c.stderr.context())
	}
	if msg, ok := strings.CutPrefix(line, "err "); ok {
		return "", fmt.Errorf("%s %s: %s", c.name, command, msg)
	}
	payload, ok := strings.CutPrefix(line, "ok")
	if !ok {
		return "", fmt.Errorf("%s %s: unexpected reply %q", c.name, command, line)
	}
	return strings.TrimPrefix(payload, " "), nil
}

// callJSON is call with a JSON reply decoded into v.
func (c *child) callJSON(ctx context.Context, command string, v any) error {
	s, err := c.call(ctx, command)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("%s %s: reply %q: %w", c.name, command, s, err)
	}
	return nil
}

// stop ends the child: a role on the close of its stdin, an external
// program on SIGTERM; after stopTimeout, SIGKILL. It returns once the
// process has been reaped. It is safe to call more than once.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	if c.stdin != nil {
		c.stdin.Close()
	} else {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-c.done:
	case <-time.After(stopTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// lineWriter splits a child's stdout into lines. A line nobody waits for
// is dropped rather than blocking the child.
type lineWriter struct {
	out  chan string
	part []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.part[:i])
		w.part = w.part[i+1:]
		select {
		case w.out <- line:
		default:
		}
	}
}

// tailBuffer keeps the last max bytes written to it, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

// context returns the captured stderr as an indented suffix for an error
// message, or "".
func (t *tailBuffer) context() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if s == "" {
		return ""
	}
	return "\n\t" + strings.ReplaceAll(s, "\n", "\n\t")
}

// stopAll stops children in reverse start order.
func stopAll(cs []*child) {
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i] != nil {
			cs[i].stop()
		}
	}
}
