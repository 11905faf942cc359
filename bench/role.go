package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
)

// A role is one process of a benchmark setup (the gozt outbound or inbound
// proxy, an x/net proxy, the splice relay, the test server, the fake
// istiod), run by `<exe> bench --role NAME ...` in a child process so that
// each one's CPU time and memory can be read from /proc.
//
// The protocol with the harness: the role prints "ready {JSON}" on stdout
// once it serves, then answers each line of stdin with one line, "ok
// [PAYLOAD]" or "err MESSAGE". Common commands: "gc" (collect and return
// memory to the OS), "stats" (JSON: goroutines, collections, heap bytes
// allocated so far, and role figures), "sched" (JSON: the longest
// stop-the-world and wait to run since the previous "sched",
// schedstats.go). The role stops when stdin closes.
type role interface {
	// info is the ready line's payload (addresses bound and the like).
	info() map[string]string
	// command handles a role-specific command line.
	command(ctx context.Context, name string, args []string) (string, error)
	// stats adds role figures to the "stats" reply.
	stats(m map[string]any)
	// close stops serving and waits for the role's goroutines.
	close() error
}

// roleFlags are the flags every role accepts.
type roleFlags struct {
	cpuprofile string
	trace      string
	gomaxprocs int
}

func (rf *roleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&rf.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole role to `FILE`, and its allocation profile beside it (.allocs.pprof)")
	fs.StringVar(&rf.trace, "trace", "", "write a runtime execution trace of the whole role to `FILE`")
	fs.IntVar(&rf.gomaxprocs, "gomaxprocs", 0, "GOMAXPROCS for the role (0: the runtime's default)")
}

type roleStarter func(ctx context.Context, args []string) (role, error)

// roles maps role names to their constructors.
func roles() map[string]roleStarter {
	return map[string]roleStarter{
		"app":       startApp,
		"gozt":      startGozt,
		"xnet-out":  startXnetOut,
		"xnet-in":   startXnetIn,
		"relay":     startRelay,
		"xds":       startXDS,
		"bare-pods": startBare,
	}
}

// runRole runs one role until stdin closes or ctx ends.
func runRole(ctx context.Context, name string, args []string, stdout io.Writer) error {
	start, ok := roles()[name]
	if !ok {
		return fmt.Errorf("bench: unknown role %q", name)
	}
	fs := flag.NewFlagSet("role", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var rf roleFlags
	rf.register(fs)
	// The common flags come first; the rest belong to the role.
	rest := splitCommonFlags(args)
	if err := fs.Parse(rest.common); err != nil {
		return fmt.Errorf("role %s: %w", name, err)
	}
	if rf.gomaxprocs > 0 {
		runtime.GOMAXPROCS(rf.gomaxprocs)
	}
	stopCPU, err := record(rf.cpuprofile, pprof.StartCPUProfile, pprof.StopCPUProfile)
	if err != nil {
		return err
	}
	defer stopCPU()
	stopTrace, err := record(rf.trace, trace.Start, trace.Stop)
	if err != nil {
		return err
	}
	defer stopTrace()
	r, err := start(ctx, rest.role)
	if err != nil {
		return fmt.Errorf("role %s: %w", name, err)
	}
	err = serveRole(ctx, r, os.Stdin, stdout)
	if cerr := r.close(); err == nil || errors.Is(err, errRoleFailed) {
		err = errors.Join(err, cerr)
	}
	if rf.cpuprofile != "" {
		err = errors.Join(err, writeAllocsProfile(allocsProfilePath(rf.cpuprofile)))
	}
	return err
}

// record creates path and starts a recording (a CPU profile, an execution
// trace) into it; the returned func stops it and closes the file. An empty
// path records nothing.
func record(path string, start func(io.Writer) error, stop func()) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		stop()
		f.Close()
	}, nil
}

// allocsProfilePath is where a role profiled into cpuprofile writes its
// allocation profile: beside it, .allocs.pprof for .pprof.
func allocsProfilePath(cpuprofile string) string {
	return strings.TrimSuffix(cpuprofile, ".pprof") + ".allocs.pprof"
}

// writeAllocsProfile writes the process's allocation profile (every
// allocation since start, sampled at the runtime's default rate) to path.
func writeAllocsProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// errRoleFailed ends a role one of whose background loops failed; the
// role's close returns the failure itself.
var errRoleFailed = errors.New("a background loop of the role failed")

type splitArgs struct{ common, role []string }

// splitCommonFlags separates the flags of roleFlags from the role's own.
func splitCommonFlags(args []string) splitArgs {
	var s splitArgs
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		if name == "cpuprofile" || name == "trace" || name == "gomaxprocs" {
			s.common = append(s.common, a)
			if !hasValue && i+1 < len(args) {
				i++
				s.common = append(s.common, args[i])
			}
			continue
		}
		s.role = append(s.role, a)
	}
	return s
}

// serveRole prints the ready line and answers commands until stdin closes
// or ctx ends.
func serveRole(ctx context.Context, r role, stdin io.Reader, stdout io.Writer) error {
	info, err := json.Marshal(r.info())
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "ready %s\n", info); err != nil {
		return err
	}
	lines := make(chan string)
	go func() {
		// This goroutine may outlive serveRole when ctx ends first; the
		// process is about to exit then.
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var failed <-chan struct{} // never, for roles without background loops
	if f, ok := r.(interface{ failed() <-chan struct{} }); ok {
		failed = f.failed()
	}
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case <-failed:
			return errRoleFailed
		case line, ok = <-lines:
		}
		if !ok {
			return nil
		}
		reply, err := roleCommand(ctx, r, line)
		if err != nil {
			reply = "err " + strings.ReplaceAll(err.Error(), "\n", " ")
		} else {
			reply = strings.TrimSuffix("ok "+reply, " ")
		}
		if _, err := fmt.Fprintln(stdout, reply); err != nil {
			return err
		}
	}
}

func roleCommand(ctx context.Context, r role, line string) (string, error) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", fmt.Errorf("empty command")
	}
	switch f[0] {
	case "gc":
		runtime.GC()
		debug.FreeOSMemory()
		return "", nil
	case "memprofilerate":
		// Sampling the heap finely (the idle-memory scenario asks for it
		// before opening its connections when profiling) would distort
		// the CPU profiles of every other scenario, so it is per command.
		n, err := strconv.Atoi(argOr(f[1:], 0, ""))
		if err != nil || n <= 0 {
			return "", fmt.Errorf("usage: memprofilerate BYTES")
		}
		runtime.MemProfileRate = n
		return "", nil
	case "heapprofile":
		if len(f) != 2 {
			return "", fmt.Errorf("usage: heapprofile FILE")
		}
		return "", writeHeapProfile(f[1])
	case "sched":
		b, err := json.Marshal(schedStats())
		return string(b), err
	case "stats":
		gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
		metrics.Read(gc)
		m := map[string]any{"goroutines": runtime.NumGoroutine(), "gc_cycles": gc[0].Value.Uint64(),
			"heap_allocs": gc[1].Value.Uint64()}
		r.stats(m)
		b, err := json.Marshal(m)
		return string(b), err
	}
	return r.command(ctx, f[0], f[1:])
}

// writeHeapProfile writes the live heap (after a GC) to path, and beside it
// the goroutines (path.goroutines, as text) and the runtime's memory classes
// (path.memclasses: where the resident memory is, heap objects against
// stacks, span metadata and fragmentation).
func writeHeapProfile(path string) error {
	runtime.GC()
	if err := writeProfile(path, "heap", 0); err != nil {
		return err
	}
	if err := writeProfile(path+".goroutines", "goroutine", 1); err != nil {
		return err
	}
	var samples []metrics.Sample
	for _, d := range metrics.All() {
		if strings.HasPrefix(d.Name, "/memory/classes/") {
			samples = append(samples, metrics.Sample{Name: d.Name})
		}
	}
	metrics.Read(samples)
	var b strings.Builder
	for _, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 {
			fmt.Fprintf(&b, "%-50s %12d\n", s.Name, s.Value.Uint64())
		}
	}
	return os.WriteFile(path+".memclasses", []byte(b.String()), 0o644)
}

// writeProfile writes the named pprof profile to path.
func writeProfile(path, name string, debug int) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(out, debug); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// noCommands is embedded by roles without commands of their own.
type noCommands struct{}

func (noCommands) command(_ context.Context, name string, _ []string) (string, error) {
	return "", fmt.Errorf("unknown command %q", name)
}

func (noCommands) stats(map[string]any) {}
