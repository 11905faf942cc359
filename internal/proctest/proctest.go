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

// FDs returns what each of process pid's descriptors refers to (the
// target of its /proc/pid/fd link: a path, "socket:[inode]", "anon_inode:[eventpoll]").
func FDs(tb testing.TB, pid int) map[int]string {
	tb.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatalf("process %d gone? %v", pid, err)
	}
	fds := make(map[int]string, len(ents))
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed since the listing
		}
		fds[fd] = target
	}
	return fds
}
