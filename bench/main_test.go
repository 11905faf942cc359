package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"testing"

	"go.uber.org/goleak"

	"github.com/gozt/gozt/internal/workers"
)

// TestMain lets the test binary stand in for the gozt binary: the harness
// re-runs its own executable as `<exe> bench --role NAME ...` for each
// process of a setup, and `<test binary> bench [flags]` runs the whole
// harness (handy while working on it).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "bench" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		err := Run(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop))
}
