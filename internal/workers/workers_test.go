package workers

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Waiting reports how many workers wait for a task now.
func (p *Pool) Waiting() int { return int(p.idle.Load()) }

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

// goroutineID returns the calling goroutine's number, from its stack trace.
func goroutineID(t *testing.T) string {
	var buf [64]byte
	id, ok := strings.CutPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	if !ok {
		t.Fatal("stack trace without a goroutine number")
	}
	id, _, _ = strings.Cut(id, " ")
	return id
}

// TestWaitingWorkerTakesTheNextTask: a worker that finished waits, and a
// later task runs on it rather than on a new goroutine. (A task handed over
// while the worker is between counting itself and its receive runs on a new
// goroutine, which then exits, the cap being 1; so the test retries.)
func TestWaitingWorkerTakesTheNextTask(t *testing.T) {
	p := New(1, time.Minute)
	ids := make(chan string, 1)
	p.Go(func() { ids <- goroutineID(t) })
	first := <-ids
	for attempt := 0; ; attempt++ {
		eventually(t, "the worker does not wait for a task", func() bool { return p.Waiting() == 1 })
		waiting := make(chan int, 1)
		p.Go(func() { waiting <- p.Waiting(); ids <- goroutineID(t) })
		w, id := <-waiting, <-ids
		if id == first {
			if w != 0 {
				t.Fatalf("while the waiting worker runs the task, Waiting() = %d, want 0", w)
			}
			return
		}
		if attempt == 100 {
			t.Fatal("100 tasks ran on new goroutines while a worker waited")
		}
		time.Sleep(time.Millisecond)
	}
}

// burst runs n tasks on p at once, lets them all finish, and checks that
// want workers then wait, and no more.
func burst(t *testing.T, p *Pool, n, want int) {
	t.Helper()
	release := make(chan struct{})
	var started sync.WaitGroup
	for range n {
		started.Add(1)
		p.Go(func() { started.Done(); <-release })
	}
	started.Wait()
	close(release)
	eventually(t, fmt.Sprintf("%d workers do not wait", want), func() bool { return p.Waiting() == want })
	time.Sleep(20 * time.Millisecond) // one more would show up by now
	if w := p.Waiting(); w != want {
		t.Fatalf("Waiting() = %d after a burst of %d, want %d", w, n, want)
	}
}

// TestIdleWorkersCapped: after a burst, at most the pool's idle count of
// workers stay; the rest exit.
func TestIdleWorkersCapped(t *testing.T) {
	burst(t, New(2, time.Minute), 8, 2)
}

// TestDefaultCapFollowsGOMAXPROCS: a pool made with idle ≤ 0 reads
// GOMAXPROCS when workers finish, not when it was made.
func TestDefaultCapFollowsGOMAXPROCS(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	p := New(0, time.Minute)
	runtime.GOMAXPROCS(1)
	burst(t, p, 12, 4)
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
