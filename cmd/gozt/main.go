// Command gozt is a drop-in, wire-compatible Go implementation of Istio's
// ztunnel. Subcommands:
//
//	gozt local [--config FILE] [--ca-dir DIR]   a whole mesh on one machine
//	gozt explain --config-dump FILE --src IP --dst IP:PORT   explain an authorization decision offline
//	gozt proxy [ztunnel]                        the node proxy, configured like ztunnel by env vars
//	gozt version                                print the version
//
// The benchmark harness is a binary of its own, cmd/gozt-bench (make
// bench), so that this one links neither it nor the fake istiod it runs;
// `gozt bench` says so and exits 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"

	"github.com/gozt/gozt/cmd/gozt/internal/admin"
	"github.com/gozt/gozt/cmd/gozt/internal/explain"
	"github.com/gozt/gozt/cmd/gozt/internal/local"
	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/cmd/gozt/internal/node"
	"github.com/gozt/gozt/internal/envconfig"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		printError(os.Stderr, os.Getenv("LOG_FORMAT"), err)
		os.Exit(exitCode(err))
	}
}

// exitCode is the process's exit status for run's error: 2 for a command
// that is not this binary's (errBenchMoved), 1 for any other failure.
func exitCode(err error) int {
	if errors.Is(err, errBenchMoved) {
		return 2
	}
	return 1
}

const usage = `usage: gozt <command> [flags]

commands:
  local     run a whole mesh on this machine (see README)
  explain   explain an authorization decision from a saved /config_dump
            (gozt explain --config-dump FILE --src IP[:PORT] [--identity SPIFFE] --dst IP:PORT)
  proxy     run as the node proxy of an Istio ambient cluster, configured by
            ztunnel's environment variables (shared in-pod mode by default, as
            Istio's chart runs it; PROXY_MODE=dedicated for one workload)
  version   print the version
  help      print this help
`

var (
	errUsage      = errors.New("unknown command (try `gozt help`)")
	errBenchMoved = errors.New("the benchmarks moved to their own binary: go run ./cmd/gozt-bench [flags] (or make bench)")
)

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "local":
		return runLocal(args[1:], stdout, stderr)
	case "bench":
		return errBenchMoved
	case "explain":
		err := explain.Run(args[1:], stdout, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	case "proxy":
		// ztunnel is started as `ztunnel proxy ztunnel`; accept and ignore
		// the trailing role argument.
		return runProxy(stderr)
	case "version":
		fmt.Fprintln(stdout, "gozt", admin.Version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return errUsage
}

func runProxy(stderr io.Writer) error {
	env, err := envconfig.Load(os.Environ())
	if err != nil {
		return err
	}
	levels, err := logLevels()
	if err != nil {
		return err
	}
	logger := newLogger(stderr, env.LogFormat, levels)
	raiseFileLimit(logger)
	workers := env.Workers.Count(runtime.NumCPU())
	runtime.GOMAXPROCS(workers)
	logger.Info("worker threads", "gomaxprocs", workers, "cpus", runtime.NumCPU())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	n, err := node.Start(ctx, node.Options{Env: env, Logger: logger, Levels: levels, MemoryLimit: memoryLimit(logger)})
	if err != nil {
		return err
	}
	logBanner(logger, env, n.Addrs())
	select {
	case <-ctx.Done():
	case <-n.Quit():
	case <-n.Done(): // a part failed (e.g. a ZDS protocol error): exit 1 with its error
	}
	stop()
	logger.Info("shutting down", "drain", env.DrainDeadline)
	dctx, cancel := context.WithTimeout(context.Background(), env.DrainDeadline)
	defer cancel()
	return n.Shutdown(dctx)
}

// logBanner logs that the proxy runs, in which mode, and where: the socket
// istio-cni hands pods over on (shared mode) or the workload listeners
// (dedicated mode). It goes through the logger, so that with
// LOG_FORMAT=json it is a JSON record like every other line.
func logBanner(logger *slog.Logger, env envconfig.Config, addrs map[string]net.Addr) {
	if env.ProxyMode == envconfig.ModeShared {
		logger.Info("gozt proxy: serving the pods istio-cni hands over", "mode", env.ProxyMode, "inpodUds", env.InpodUDS)
		return
	}
	listeners := make([]any, 0, len(addrs))
	for _, name := range slices.Sorted(maps.Keys(addrs)) {
		listeners = append(listeners, slog.String(name, addrs[name].String()))
	}
	logger.Info("gozt proxy: serving the workload", "mode", env.ProxyMode,
		"workload", env.WorkloadNamespace+"/"+env.WorkloadName, slog.Group("listeners", listeners...))
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit (SPEC §0.1).
func raiseFileLimit(logger *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			logger.Warn("cannot raise the open-file limit", "error", err)
		}
	}
}

func runLocal(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gozt local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts local.Options
	fs.StringVar(&opts.ConfigPath, "config", "", "local config YAML (SPEC §5.5); default: the embedded demo")
	fs.StringVar(&opts.CADir, "ca-dir", "", "CA directory in Istio's cacerts layout, created if absent")
	fs.StringVar(&opts.AdminAddr, "admin-addr", "127.0.0.1:15000", "admin address (loopback only)")
	fs.StringVar(&opts.MetricsAddr, "metrics-addr", "127.0.0.1:15020", "Prometheus metrics address")
	fs.StringVar(&opts.ReadinessAddr, "readiness-addr", "127.0.0.1:15021", "readiness address")
	env, err := envconfig.LoadLocal(os.Environ())
	if err != nil {
		return err
	}
	fs.StringVar(&env.Network, "network", env.Network, "this node's network name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts.Env = &env
	levels, err := logLevels()
	if err != nil {
		return err
	}
	opts.Levels = levels
	opts.Logger = newLogger(stderr, env.LogFormat, levels)
	opts.Out = stdout
	raiseFileLimit(opts.Logger)
	opts.MemoryLimit = memoryLimit(opts.Logger)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m, err := local.Start(ctx, opts)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-m.Quit():
	case <-m.Done(): // a background loop failed: exit 1 with its error
	}
	stop() // a second SIGINT now kills the process at once
	opts.Logger.Info("shutting down", "drain", env.DrainDeadline)
	dctx, cancel := context.WithTimeout(context.Background(), env.DrainDeadline)
	defer cancel()
	return m.Shutdown(dctx)
}

// logLevels reads the log levels: RUST_LOG as ztunnel reads it (Istio's
// chart sets it from logLevel: a default and per-scope levels), then
// LOG_LEVEL, gozt's own, which sets the default when given. The admin
// port's /logging changes them at run time and resets to these.
func logLevels() (*logscope.Levels, error) {
	filter, err := logscope.Parse(os.Getenv("RUST_LOG"))
	if err != nil {
		return nil, err
	}
	if v := os.Getenv("LOG_LEVEL"); v != "" {
		var l slog.Level
		if err := l.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("LOG_LEVEL: %w", err)
		}
		filter.Default = &l
	}
	return logscope.NewLevels(filter), nil
}
