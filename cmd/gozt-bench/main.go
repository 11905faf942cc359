// Command gozt-bench is the benchmark harness (package bench): gozt's data
// path side by side with its baselines, every figure a ratio against a
// baseline measured in the same run. It is a binary of its own so that the
// node binary, cmd/gozt, links neither the harness nor the fake istiod it
// runs (deps_test.go holds that).
//
//	go run ./cmd/gozt-bench --quick                 every scenario, 3 short repetitions (make bench-quick)
//	go run ./cmd/gozt-bench                         the thorough run (make bench)
//	go run ./cmd/gozt-bench --scenario NAME         one scenario (--list shows them)
//
// The harness starts each process of a setup by re-running its own
// executable as `<exe> bench --role NAME ...` (bench.Run's contract, which
// the bench package's test binary honours too), so a leading "bench" is
// accepted and dropped: `gozt-bench bench ARGS` is `gozt-bench ARGS`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gozt/gozt/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := bench.Run(ctx, benchArgs(os.Args[1:]), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gozt:", err)
		os.Exit(1)
	}
}

// benchArgs returns the arguments for bench.Run: args without the leading
// "bench" of the harness's re-run of itself.
func benchArgs(args []string) []string {
	if len(args) > 0 && args[0] == "bench" {
		return args[1:]
	}
	return args
}
