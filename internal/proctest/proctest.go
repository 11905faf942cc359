// Package proctest reads what tests check of another process from /proc:
// its open-file limit and how many descriptors it holds. (prlimit(2) on
// another process needs CAP_SYS_RESOURCE, which root in a container may
// lack; /proc needs only ptrace access, which root has.)
package proctest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// OpenFileLimit returns process pid's soft RLIMIT_NOFILE.
func OpenFileLimit(tb testing.TB, pid int) int {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && f[0] == "Max" && f[1] == "open" && f[2] == "files" {
			n, err := strconv.Atoi(f[3])
			if err != nil {
				tb.Fatalf("/proc/%d/limits: open files %q", pid, f[3])
			}
			return n
		}
	}
	tb.Fatalf("no open-files line in /proc/%d/limits", pid)
	return 0
}

// OpenFDs returns how many descriptors process pid holds.
func OpenFDs(tb testing.TB, pid int) int {
	tb.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		tb.Fatalf("process %d gone? %v", pid, err)
	}
	return len(ents)
}
