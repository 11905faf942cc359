package bench

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/exp/trace"
)

// What a stalled connection waited for: with --trace-dir, the xds-push
// scenario's probe writes each round trip of stallLogMin or more to
// <dir>/xds-push-probe.stalls (its start as Unix nanoseconds, its length in
// nanoseconds, one per line), beside the proxies' execution traces; and
// `gozt bench --stalls DIR` reads both and says, for each such round trip,
// what every proxy's Ps ran while it lasted and which goroutines waited to
// run. A round trip that waited while no goroutine held a P for long, and
// none waited to run, waited for the kernel (a core), not for the Go
// scheduler.

// stallLogMin is the shortest round trip the probe logs: below the calm
// stalls this machine shows anyway (2–5 ms), so that they can be compared.
const stallLogMin = 2 * time.Millisecond

// stallLog appends a probe's long round trips to a file; nil logs nothing.
type stallLog struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func newStallLog(path string) (*stallLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &stallLog{w: bufio.NewWriter(f), f: f}, nil
}

func (l *stallLog) add(start time.Time, d time.Duration) {
	if l == nil || d < stallLogMin {
		return
	}
	l.mu.Lock()
	fmt.Fprintf(l.w, "%d %d\n", start.UnixNano(), int64(d))
	l.mu.Unlock()
}

func (l *stallLog) close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(l.w.Flush(), l.f.Close())
}

// stallWindow is one logged round trip, in Unix nanoseconds.
type stallWindow struct{ start, end int64 }

// readStalls reads every *.stalls file in dir, keeping round trips of at
// least min, in time order.
func readStalls(dir string, min time.Duration) ([]stallWindow, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.stalls"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.stalls file in %s (gozt bench --trace-dir %s --scenario xds-push writes one)", dir, dir)
	}
	var ws []stallWindow
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			var start, d int64
			if len(f) == 2 {
				start, err = strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					d, err = strconv.ParseInt(f[1], 10, 64)
				}
			}
			if len(f) != 2 || err != nil {
				return nil, fmt.Errorf("%s:%d: want \"<start ns> <length ns>\", got %q", name, i+1, line)
			}
			if time.Duration(d) >= min {
				ws = append(ws, stallWindow{start, start + d})
			}
		}
	}
	slices.SortFunc(ws, func(a, b stallWindow) int { return cmp.Compare(a.start, b.start) })
	return ws, nil
}

// stallSpan is something one process did during a window: a goroutine
// running on a P, or a runnable goroutine waiting for one (p < 0).
type stallSpan struct {
	start, end int64 // Unix nanoseconds
	p          int64
	g          int64
	what       string
}

// stallSpanMin is the shortest run or wait the report lists.
const stallSpanMin = 500 * time.Microsecond

// traceSpans reads one execution trace and returns its goroutines' runs
// and waits to run of at least stallSpanMin, in Unix nanoseconds (the
// trace's clock snapshots map its clock to the wall's).
func traceSpans(path string) ([]stallSpan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := trace.NewReader(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var (
		off      int64 // wall − trace clock; valid once synced
		synced   bool
		spans    []stallSpan
		names    = map[trace.GoID]string{}
		runSince = map[trace.GoID]trace.Time{}
		runOn    = map[trace.GoID]trace.ProcID{}
		ready    = map[trace.GoID]trace.Time{}
	)
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if ev.Kind() == trace.EventSync {
			if cs := ev.Sync().ClockSnapshot; cs != nil {
				off, synced = cs.Wall.UnixNano()-int64(cs.Trace), true
			}
			continue
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := st.Resource.Goroutine()
		from, to := st.Goroutine()
		// The event's own stack is g's only when g made the event (a
		// goroutine woken by another carries its waker's).
		stacks := []trace.Stack{st.Stack}
		if ev.Goroutine() == g {
			stacks = append(stacks, ev.Stack())
		}
		for _, s := range stacks {
			if n := goroutineName(s); n != "" && !strings.HasPrefix(names[g], "GC") && !strings.HasPrefix(names[g], "push") {
				names[g] = n
			}
		}
		now := ev.Time()
		switch {
		case to == trace.GoRunnable:
			ready[g] = now
		case to == trace.GoRunning:
			if t, ok := ready[g]; ok && from == trace.GoRunnable && synced && now.Sub(t) >= stallSpanMin {
				spans = append(spans, stallSpan{int64(t) + off, int64(now) + off, -1, int64(g), names[g]})
			}
			delete(ready, g)
			runSince[g], runOn[g] = now, ev.Proc()
		}
		if from == trace.GoRunning {
			if t, ok := runSince[g]; ok && synced && now.Sub(t) >= stallSpanMin {
				spans = append(spans, stallSpan{int64(t) + off, int64(now) + off, int64(runOn[g]), int64(g), names[g]})
			}
			delete(runSince, g)
		}
	}
	return spans, nil
}

// goroutineName names a goroutine by a stack of it: the collector's mark
// worker, a push decoded at low priority (xds.runLowPriority), or else its
// first three frames outside the runtime. "" when the stack says nothing.
func goroutineName(s trace.Stack) string {
	var frames []string
	for f := range s.Frames() {
		switch {
		case strings.HasSuffix(f.Func, "runtime.gcBgMarkWorker"):
			return "GC mark worker"
		case strings.HasSuffix(f.Func, "xds.runLowPriority.func1"):
			return strings.TrimSuffix("push at low priority: "+strings.Join(frames, " < "), ": ")
		}
		if len(frames) < 3 && !strings.HasPrefix(f.Func, "runtime.") && !strings.HasPrefix(f.Func, "internal/runtime") {
			frames = append(frames, f.Func)
		}
	}
	return strings.Join(frames, " < ")
}

// StallReport writes what each long round trip of dir's *.stalls files
// (min or longer) met in each process whose execution trace is in dir:
// every run of a goroutine on a P, and every wait of a runnable goroutine
// for a P, of stallSpanMin or more that overlaps it, with their times from
// the round trip's start.
func StallReport(w io.Writer, dir string, min time.Duration) error {
	ws, err := readStalls(dir, min)
	if err != nil {
		return err
	}
	traces, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	if err != nil {
		return err
	}
	if len(traces) == 0 {
		return fmt.Errorf("no *.trace file in %s", dir)
	}
	spans := map[string][]stallSpan{}
	for _, t := range traces {
		if spans[t], err = traceSpans(t); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "%d round trips of %v or more; runs (P) and waits to run (wait) of %v or more, from the round trip's start:\n", len(ws), min, stallSpanMin)
	for _, win := range ws {
		fmt.Fprintf(w, "\n%s round trip of %.2f ms\n", time.Unix(0, win.start).UTC().Format("15:04:05.000"), float64(win.end-win.start)/1e6)
		for _, t := range traces {
			var lines []string
			for _, s := range spans[t] {
				if s.end <= win.start || s.start >= win.end {
					continue
				}
				where := "wait"
				if s.p >= 0 {
					where = fmt.Sprintf("P%d ", s.p)
				}
				lines = append(lines, fmt.Sprintf("    %+7.2f..%+7.2f ms  %s g%d %.2f ms  %s", float64(s.start-win.start)/1e6,
					float64(s.end-win.start)/1e6, where, s.g, float64(s.end-s.start)/1e6, s.what))
			}
			if len(lines) == 0 {
				continue
			}
			fmt.Fprintf(w, "  %s:\n%s\n", strings.TrimSuffix(filepath.Base(t), ".trace"), strings.Join(lines, "\n"))
		}
	}
	return nil
}
