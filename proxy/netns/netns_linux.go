package netns

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Open opens the network namespace at path, such as /proc/self/ns/net or
// /run/netns/NAME.
func Open(path string) (*Handle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("netns: open: %w", err)
	}
	return New(f)
}

// New returns a Handle for the open namespace file f, taking ownership of
// f: it is closed by Handle.Close, or at once if New fails. It does not
// check that f is a network namespace; Enter fails if it is not.
func New(f *os.File) (*Handle, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: stat: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		f.Close()
		return nil, fmt.Errorf("netns: stat %s: no inode", f.Name())
	}
	home, err := processHome()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Handle{f: f, home: home, inode: st.Ino, dev: st.Dev}, nil
}

// processHome is the process's own namespace (Home), opened by the first
// New and shared by every Handle from then on: it never changes while the
// process runs, so one descriptor serves a node's every pod instead of one
// each, and a pod's New no longer starts a goroutine to find it.
var processHome = sync.OnceValues(Home)

// Run calls fn on a thread inside the namespace and returns fn's error:
// sockets fn creates stay in the namespace, goroutines it starts do not.
func (h *Handle) Run(fn func() error) error { return h.Enter(Whole(fn)) }

// Enter is h's Func: Run for a fn that may leave the namespace before it
// returns (EnterFD, returning the thread to the process's own namespace as
// New opened it).
func (h *Handle) Enter(fn func(leave func() error) error) error {
	rc, err := h.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("netns: fd: %w", err)
	}
	hc, err := h.home.SyscallConn()
	if err != nil {
		return fmt.Errorf("netns: own netns fd: %w", err)
	}
	// Control holds a reference on each fd, so a concurrent Close cannot
	// recycle a descriptor number under setns.
	var runErr error
	err = rc.Control(func(fd uintptr) {
		herr := hc.Control(func(home uintptr) { runErr = EnterFD(int(fd), int(home), fn) })
		if herr != nil {
			runErr = fmt.Errorf("netns: own netns fd: %w", herr)
		}
	})
	if err != nil {
		return fmt.Errorf("netns: fd: %w", err)
	}
	return runErr
}

// Home opens the network namespace that this process's threads run in: that
// of any thread no EnterFD call holds. (EnterFD restores its thread or ends
// the process, and the Go runtime starts new threads from a thread of its
// own when the one asking is locked, so a thread that runs other goroutines
// is always there.) It looks from a new goroutine, which never runs on a
// thread that EnterFD holds; /proc/self/ns/net instead names the main
// thread's namespace, which is a pod's while fn runs on the main thread.
func Home() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		f, err := os.Open("/proc/thread-self/ns/net")
		done <- result{f, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("netns: open own netns: %w", r.err)
	}
	return r.f, nil
}

// EnterFD runs fn as a Func does, inside the namespace nsfd, on the calling
// goroutine: it locks the goroutine to its thread, moves the thread into
// nsfd, and moves it back to homefd, the process's own network namespace as
// Home opened it, when fn calls leave or returns (or panics), unlocking it
// again. The caller must not be inside another namespace's function.
//
// Nothing is handed to another goroutine: a dial run on a goroutine of its
// own costs about 1.5× the CPU of the same dial on the caller's
// (sockopt's BenchmarkDialInNetns). Going back to homefd rather than to the
// namespace the thread was found in saves opening /proc/thread-self/ns/net
// on every call, a path walk through procfs that costs more than both
// setns(2) calls together; the two are the same (see Home).
//
// If the thread cannot be moved back, EnterFD ends the process (noWayHome):
// the calling goroutine would otherwise go on in the pod's namespace and
// make its later sockets there, and a panic would not do, as a proxy's
// connection handlers recover from panics and their goroutines go on
// serving. setns(2) into a namespace file that is held open fails only for
// want of kernel memory (ztunnel too treats it as something that must never
// fail, with a panic its tasks unwind from).
func EnterFD(nsfd, homefd int, fn func(leave func() error) error) error {
	runtime.LockOSThread()
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter: %w", err)
	}
	left := false
	leave := func() error {
		if left {
			return nil
		}
		left = true
		if err := unix.Setns(homefd, unix.CLONE_NEWNET); err != nil {
			noWayHome(err)
		}
		runtime.UnlockOSThread()
		return nil
	}
	defer leave()
	return fn(leave)
}

// noWayHome ends the process for a thread that cannot leave a pod's
// namespace, saying why on standard error, where gozt's logs go.
func noWayHome(err error) {
	fmt.Fprintf(os.Stderr, "gozt: fatal: a thread cannot return from a network namespace: %v\n", err)
	os.Exit(2)
}
