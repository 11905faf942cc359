package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threadNice returns the nice value of every thread of process pid
// (/proc/<pid>/task/<tid>/stat field 19).
func threadNice(t *testing.T, pid int) map[int]int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	nice := map[int]int{}
	for _, e := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		tid, _ := strconv.Atoi(e.Name())
		if nice[tid], err = strconv.Atoi(f[16]); err != nil {
			t.Fatalf("thread %d stat %q: %v", tid, b, err)
		}
	}
	return nice
}

// TestXDSRoleStandsOffTheNode: with --low-priority every thread of the fake
// istiod runs at nice 19, the ones the runtime starts after a push of
// 20,000 workloads too; a push that was prepared says so, and one that was
// not (another size) is built in the push and says that; stats counts the
// process's garbage collections.
func TestXDSRoleStandsOffTheNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	x, err := startRole(ctx, exe, "xds", []string{"--ca-out", filepath.Join(t.TempDir(), "ca.pem"), "--clients", "0", "--low-priority"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer x.stop()
	push := func(cmd string) pushResult {
		t.Helper()
		var res pushResult
		if err := x.callJSON(ctx, cmd, &res); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return res
	}
	allocs0, err := heapAllocs(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.call(ctx, "prepare 20000 a"); err != nil {
		t.Fatal(err)
	}
	if res := push("push 20000 a"); !res.Prepared || res.WireBytes < 20000*100 {
		t.Errorf("prepared push: %+v, want prepared and about 230 B per workload", res)
	}
	if _, err := x.call(ctx, "prepare 10 b"); err != nil {
		t.Fatal(err)
	}
	if res := push("push 20 b"); res.Prepared || res.WireBytes == 0 {
		t.Errorf("push of another size than prepared: %+v, want built in the push", res)
	}
	if res := push("push 10 b"); res.Prepared {
		t.Errorf("second push of a prepared size: %+v, want the preparation used once", res)
	}
	// Every role counts its collections in stats, as the push scenario
	// reads them.
	gc0, err := gcCycles(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.call(ctx, "gc"); err != nil {
		t.Fatal(err)
	}
	if gc1, err := gcCycles(ctx, x); err != nil || gc1 <= gc0 {
		t.Errorf("collections %d before a gc command, %d after (%v); want more", gc0, gc1, err)
	}
	// And its heap allocations, as the connect scenario reads them:
	// building 20,000 workloads allocates at least their wire bytes.
	if allocs1, err := heapAllocs(ctx, x); err != nil || allocs1 < allocs0+20000*100 {
		t.Errorf("heap allocations %d before the pushes, %d after (%v); want 2 MB more at least", allocs0, allocs1, err)
	}
	for tid, n := range threadNice(t, x.pid()) {
		if n != 19 {
			t.Errorf("thread %d of the xds role at nice %d, want 19", tid, n)
		}
	}
}

// TestLowestPriorityWhileThreadsStart: lowestPriority leaves no thread at
// nice 0 even while the runtime starts threads during the renice (as it does
// while a role starts up). Goroutines that lock their thread and exit make
// the runtime start a new thread each time, from whichever thread runs; a
// single pass over /proc/self/task misses those started by a thread it had
// not reniced yet. It runs in a child process, which it makes nice 19.
func TestLowestPriorityWhileThreadsStart(t *testing.T) {
	if os.Getenv("BENCH_HELPER_RENICE") != "" {
		stop := make(chan struct{})
		for range 16 {
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					done := make(chan struct{})
					go func() {
						runtime.LockOSThread() // exits locked: the thread ends with it
						close(done)
					}()
					<-done
				}
			}()
		}
		time.Sleep(20 * time.Millisecond)
		err := lowestPriority()
		time.Sleep(20 * time.Millisecond) // threads started after it must inherit 19
		close(stop)
		if err != nil {
			t.Fatal(err)
		}
		for tid, n := range threadNice(t, os.Getpid()) {
			if n != 19 {
				t.Errorf("thread %d at nice %d, want 19", tid, n)
			}
		}
		return
	}
	for i := range 20 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLowestPriorityWhileThreadsStart$", "-test.count=1")
		cmd.Env = append(os.Environ(), "BENCH_HELPER_RENICE=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
	}
}
