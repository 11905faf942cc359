package sockopt

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetns runs fn with its goroutine inside the network namespace at path
// (for example /run/netns/NAME or /proc/PID/ns/net) and returns fn's error.
// See InNetnsFD.
func InNetns(path string, fn func() error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sockopt: open netns: %w", err)
	}
	defer f.Close()
	return InNetnsFD(int(f.Fd()), fn)
}

// InNetnsFD runs fn with its goroutine inside the network namespace that the
// open file descriptor nsfd refers to (such as one received from istio-cni
// over ZDS, SPEC §9) and returns fn's error. It needs CAP_SYS_ADMIN.
//
// fn runs on a new goroutine locked to its OS thread, which setns(2) moves
// into the namespace and moves back afterwards; the calling goroutine's
// thread is never touched. Sockets that fn creates (net.Listen, net.Dial,
// ListenConfig.Listen, Dialer.Dial) belong to that namespace for their whole
// life and may be used from any goroutine afterwards. Goroutines that fn
// starts do not run in the namespace: make every socket inside fn itself.
// If the thread cannot be moved back it is not reused: the goroutine exits
// still locked, and the Go runtime then ends the thread. A panic in fn is
// re-raised on the calling goroutine after the thread is restored.
//
// Each time fn blocks, its locked thread sleeps and another takes over
// (and back when fn may go on), so fn should not wait: DialInNetns makes a
// socket inside and waits for its connect outside.
func InNetnsFD(nsfd int, fn func() error) error {
	return inNetns(nsfd, -1, fn)
}

// InNetnsFDHome is InNetnsFD for a caller that holds homefd, the process's
// own network namespace as HomeNetns opened it: fn's thread goes back there
// afterwards rather than to the namespace it was found in. The two are the
// same (see HomeNetns), but finding out which that is takes opening
// /proc/thread-self/ns/net on every call, a path walk through procfs that
// cost more than both setns(2) calls together in gozt bench's shared
// scenario.
func InNetnsFDHome(nsfd, homefd int, fn func() error) error {
	return inNetns(nsfd, homefd, fn)
}

// HomeNetns opens the network namespace that this process's threads run
// in: that of any thread no InNetnsFD call holds. (InNetnsFD restores or
// retires every thread it moves, and the Go runtime starts new threads from
// a thread of its own when the one asking is locked, so a thread that runs
// other goroutines is always there.) It looks from a new goroutine, which
// never runs on a thread that InNetnsFD holds; /proc/self/ns/net instead
// names the main thread's namespace, which is a pod's while fn runs on the
// main thread.
func HomeNetns() (*os.File, error) {
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
		return nil, fmt.Errorf("sockopt: open own netns: %w", r.err)
	}
	return r.f, nil
}

// inNetns is InNetnsFD, and InNetnsFDHome when homefd ≥ 0.
func inNetns(nsfd, homefd int, fn func() error) error {
	done := make(chan netnsResult, 1)
	go runInNetns(nsfd, homefd, fn, done)
	r := <-done
	if r.panicked {
		panic(r.panicValue)
	}
	return r.err
}

type netnsResult struct {
	err        error
	panicked   bool
	panicValue any
}

// runInNetns is InNetnsFD's goroutine: it enters the namespace, runs fn and
// moves the thread back to homefd, or to the namespace it was in if homefd
// is negative.
func runInNetns(nsfd, homefd int, fn func() error, done chan<- netnsResult) {
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()

	orig := homefd
	if orig < 0 {
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			restored = true // never left
			done <- netnsResult{err: fmt.Errorf("sockopt: open current netns: %w", err)}
			return
		}
		defer unix.Close(fd)
		orig = fd
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		restored = true
		done <- netnsResult{err: fmt.Errorf("sockopt: enter netns: %w", err)}
		return
	}

	r := callNetnsFunc(fn)
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		r.err = fmt.Errorf("sockopt: restore netns: %w (after fn returned %v)", err, r.err)
	} else {
		restored = true
	}
	done <- r
}

// callNetnsFunc calls fn, turning a panic into a result so the thread can be
// restored before the panic goes on.
func callNetnsFunc(fn func() error) (r netnsResult) {
	defer func() {
		if v := recover(); v != nil {
			r = netnsResult{panicked: true, panicValue: v}
		}
	}()
	return netnsResult{err: fn()}
}
