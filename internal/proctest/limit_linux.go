package proctest

import (
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// LeaveDescriptors fills every free descriptor number of this process below
// its highest open one and lowers its soft RLIMIT_NOFILE so that exactly n
// more descriptors can be opened (n may be 0: then every open fails with
// EMFILE). The returned function undoes both, as the test's cleanup does if
// it was not called; tests that call it must not run in parallel with others
// of their process.
func LeaveDescriptors(tb testing.TB, n int) (restore func()) {
	tb.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		tb.Fatal(err)
	}
	var fillers []int
	var once sync.Once
	undo := func() {
		once.Do(func() {
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				tb.Errorf("restore RLIMIT_NOFILE: %v", err)
			}
			for _, fd := range fillers {
				syscall.Close(fd)
			}
		})
	}
	tb.Cleanup(undo)
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	highest := 0
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			highest = max(highest, fd)
		}
	}
	// Each open takes the lowest free number: the first above highest means
	// every number below it is taken.
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			undo()
			tb.Fatal(err)
		}
		if fd > highest {
			syscall.Close(fd)
			cur := lim
			cur.Cur = uint64(fd + n)
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
				undo()
				tb.Fatal(err)
			}
			return undo
		}
		fillers = append(fillers, fd)
	}
}

// NoneLeft reports whether this process can open no more descriptors: what a
// test that called LeaveDescriptors checks once its own sockets are made, as
// another goroutine that closes one meanwhile leaves the limit loose.
func NoneLeft() bool {
	fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return true
	}
	syscall.Close(fd)
	return false
}
