package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// newNetns creates a network namespace with its loopback interface up and
// returns a file holding it. Nothing is mounted: the namespace lasts as
// long as a descriptor of it or a process in it. It needs CAP_SYS_ADMIN.
func newNetns() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		// A thread that cannot return home stays locked, so that the
		// runtime ends it with this goroutine.
		runtime.LockOSThread()
		f, home, err := makeNetns()
		if home {
			runtime.UnlockOSThread()
		}
		done <- result{f, err}
	}()
	r := <-done
	return r.f, r.err
}

// makeNetns moves the calling (locked) thread into a new network namespace,
// opens it, brings its loopback up and moves the thread back. It reports
// whether the thread is back home.
func makeNetns() (_ *os.File, home bool, _ error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer self.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("unshare network namespace: %w", err)
	}
	f, err := os.Open("/proc/thread-self/ns/net")
	if err == nil {
		if err = loopbackUp(); err != nil {
			f.Close()
			f = nil
		}
	}
	if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
		if f != nil {
			f.Close()
		}
		return nil, false, fmt.Errorf("setns back: %w", serr)
	}
	return f, true, err
}

// loopbackUp sets the IFF_UP flag of "lo" in the calling thread's network
// namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// netnsExecFlag is Run's first argument for execInNetns.
const netnsExecFlag = "--netns-exec"

// execInNetns is `<exe> bench --netns-exec PATH PROGRAM ARGS...`: it moves
// its thread into the network namespace at PATH and executes PROGRAM there
// (execve keeps the calling thread's namespaces), so that a program that
// cannot enter one itself (the gozt binary, a role) starts in it. It
// returns only on failure.
func execInNetns(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("bench: usage: %s PATH PROGRAM [ARGS...]", netnsExecFlag)
	}
	runtime.LockOSThread() // never unlocked: the thread executes the program or the process fails
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", args[0], err)
	}
	f.Close()
	return syscall.Exec(args[1], args[1:], os.Environ())
}

// inNetnsOf makes cmd start in the network namespace held by f, which must
// stay open until the command has started: exe (the harness's executable)
// runs first, as execInNetns, and executes the command's program.
func inNetnsOf(f *os.File, exe string) func(*exec.Cmd) {
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	return func(cmd *exec.Cmd) {
		cmd.Args = slices.Concat([]string{exe, "bench", netnsExecFlag, path, cmd.Path}, cmd.Args[1:])
		cmd.Path = exe
	}
}

// procRunTime is the CPU time that process pid's live threads have run
// (/proc/<pid>/task/*/schedstat, in nanoseconds: precise where utime and
// stime count 10 ms ticks).
func procRunTime(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited since the listing
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("parse %s/%s/schedstat", dir, t.Name())
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// procFDs is the number of open descriptors of process pid.
func procFDs(pid int) (int, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es), err
}
