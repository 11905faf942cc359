package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	for tid, n := range threadNice(t, x.pid()) {
		if n != 19 {
			t.Errorf("thread %d of the xds role at nice %d, want 19", tid, n)
		}
	}
}
