package node

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// runner runs the node's background loops. The first loop to fail cancels
// the others' context and closes Failed; Stop cancels them all and returns
// that first failure. A loop that returns after the context is cancelled has
// not failed, whatever it returns.
type runner struct {
	ctx    context.Context
	cancel context.CancelFunc
	g      *errgroup.Group
}

func newRunner() *runner {
	parent, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(parent)
	return &runner{ctx: ctx, cancel: cancel, g: g}
}

// Go runs f on its own goroutine with the runner's context.
func (r *runner) Go(name string, f func(context.Context) error) {
	r.g.Go(func() error {
		if err := f(r.ctx); err != nil && r.ctx.Err() == nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

// Failed is closed once a loop has failed, or once Stop was called.
func (r *runner) Failed() <-chan struct{} { return r.ctx.Done() }

// Stop cancels every loop, waits for all of them and returns the first
// failure.
func (r *runner) Stop() error {
	r.cancel()
	return r.g.Wait()
}
