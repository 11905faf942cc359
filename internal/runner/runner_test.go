package runner

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestFirstFailureStopsAll: the first loop that fails cancels the others,
// closes Failed, and is what Stop returns; loops that end because of the
// cancellation are not failures.
func TestFirstFailureStopsAll(t *testing.T) {
	r := New()
	boom := errors.New("boom")
	cancelled := make(chan struct{})
	r.Go("patient", func(ctx context.Context) error {
		<-ctx.Done()
		close(cancelled)
		return ctx.Err() // not a failure: the runner stopped it
	})
	r.Go("failing", func(context.Context) error { return boom })
	select {
	case <-r.Failed():
	case <-time.After(5 * time.Second):
		t.Fatal("Failed not closed after a loop failed")
	}
	<-cancelled
	if err := r.Stop(); !errors.Is(err, boom) || err.Error() != "failing: boom" {
		t.Errorf("Stop = %v, want the failing loop's error, named", err)
	}
}

// TestStopWithoutFailure: Stop cancels every loop and returns nil when none
// failed.
func TestStopWithoutFailure(t *testing.T) {
	r := New()
	for range 3 {
		r.Go("loop", func(ctx context.Context) error {
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}
	if err := r.Stop(); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	select {
	case <-r.Failed():
	default:
		t.Error("Failed still open after Stop")
	}
}
