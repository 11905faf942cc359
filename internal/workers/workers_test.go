package workers

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// eventually polls cond until it holds or a second has passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 1s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGoRunsEveryTask(t *testing.T) {
	p := New(2, time.Minute)
	const n = 100
	var wg sync.WaitGroup
	ran := make([]bool, n)
	for i := range n {
		wg.Add(1)
		p.Go(func() { defer wg.Done(); ran[i] = true })
	}
	wg.Wait()
	for i, ok := range ran {
		if !ok {
			t.Fatalf("task %d did not run", i)
		}
	}
}

// TestWaitingWorkerTakesTheNextTask: a worker that finished waits, and the
// next task runs on it rather than on a new goroutine.
func TestWaitingWorkerTakesTheNextTask(t *testing.T) {
	p := New(1, time.Minute)
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	eventually(t, "the worker does not wait for a task", func() bool { return p.Waiting() == 1 })
	time.Sleep(5 * time.Millisecond) // from counting itself to its receive

	release := make(chan struct{})
	running := make(chan struct{})
	p.Go(func() { close(running); <-release })
	<-running
	if w := p.Waiting(); w != 0 {
		t.Fatalf("while the waiting worker runs the second task, Waiting() = %d, want 0", w)
	}
	close(release)
	eventually(t, "the worker does not wait again", func() bool { return p.Waiting() == 1 })
}

// TestIdleWorkersCapped: after a burst, at most the pool's idle count of
// workers stay; the rest exit.
func TestIdleWorkersCapped(t *testing.T) {
	p := New(2, time.Minute)
	release := make(chan struct{})
	var started sync.WaitGroup
	for range 8 {
		started.Add(1)
		p.Go(func() { started.Done(); <-release })
	}
	started.Wait()
	close(release)
	eventually(t, "two workers do not wait", func() bool { return p.Waiting() == 2 })
	time.Sleep(20 * time.Millisecond) // a third would show up by now
	if w := p.Waiting(); w != 2 {
		t.Fatalf("Waiting() = %d after the burst, want the cap 2", w)
	}
}

// TestDefaultCapFollowsGOMAXPROCS: a pool made with idle ≤ 0 reads
// GOMAXPROCS when workers finish, not when it was made.
func TestDefaultCapFollowsGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	p := New(0, time.Minute)
	runtime.GOMAXPROCS(1)
	release := make(chan struct{})
	var started sync.WaitGroup
	for range 12 {
		started.Add(1)
		p.Go(func() { started.Done(); <-release })
	}
	started.Wait()
	close(release)
	eventually(t, "four workers do not wait", func() bool { return p.Waiting() == 4 })
	time.Sleep(20 * time.Millisecond)
	if w := p.Waiting(); w != 4 {
		t.Fatalf("Waiting() = %d with GOMAXPROCS 1, want 4", w)
	}
}

func TestIdleWorkerExitsAfterLinger(t *testing.T) {
	p := New(4, 10*time.Millisecond)
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
	eventually(t, "the idle worker does not exit after its linger", func() bool { return p.Waiting() == 0 })
	// And the pool still runs tasks, on a new goroutine.
	again := make(chan struct{})
	p.Go(func() { close(again) })
	select {
	case <-again:
	case <-time.After(time.Second):
		t.Fatal("a task after the workers exited did not run")
	}
}

// deep uses about n KiB of stack.
//
//go:noinline
func deep(n int) byte {
	var pad [1024]byte
	pad[n%1024] = byte(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%1024]
}

// BenchmarkDeepTask compares a task that needs 32 KiB of stack started with
// a go statement (the stack grows from the runtime's start size, copying
// itself each time) against the same task on a pool's workers. Read the
// ratio of the two in one run.
func BenchmarkDeepTask(b *testing.B) {
	task := func(wg *sync.WaitGroup) func() {
		return func() { deep(32); wg.Done() }
	}
	b.Run("go", func(b *testing.B) {
		var wg sync.WaitGroup
		for b.Loop() {
			wg.Add(1)
			go task(&wg)()
			wg.Wait()
		}
	})
	b.Run("pool", func(b *testing.B) {
		p := New(0, time.Second)
		var wg sync.WaitGroup
		for b.Loop() {
			wg.Add(1)
			p.Go(task(&wg))
			wg.Wait()
		}
	})
}
