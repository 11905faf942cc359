// Package runner runs the background loops that `gozt proxy`, `gozt local`
// and gozt bench's gozt role wire (certificates, connection re-checks, xDS,
// accept loops, the inpod manager) under one errgroup, so the first failure
// stops the others and shutdown returns it. cmd/gozt and bench import it.
package runner

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// Runner runs background loops. The first loop to fail cancels the others'
// context and closes Failed; Stop cancels them all and returns that first
// failure. A loop that returns after the context is cancelled has not
// failed, whatever it returns.
type Runner struct {
	ctx    context.Context
	cancel context.CancelFunc
	g      *errgroup.Group
}

// New returns a Runner with no loops.
func New() *Runner {
	parent, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(parent)
	return &Runner{ctx: ctx, cancel: cancel, g: g}
}

// Go runs f on its own goroutine with the runner's context.
func (r *Runner) Go(name string, f func(context.Context) error) {
	r.g.Go(func() error {
		if err := f(r.ctx); err != nil && r.ctx.Err() == nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// Failed is closed once a loop has failed, or once Stop was called.
func (r *Runner) Failed() <-chan struct{} { return r.ctx.Done() }

// Stop cancels every loop, waits for all of them and returns the first
// failure.
func (r *Runner) Stop() error {
	r.cancel()
	return r.g.Wait()
}
