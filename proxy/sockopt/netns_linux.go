package sockopt

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"

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
// (and back when fn may go on), so fn should not wait: DialInNetns makes
// its socket inside, leaves (InNetnsFunc) and waits for the connect
// outside.
func InNetnsFD(nsfd int, fn func() error) error {
	return inNetns(nsfd, whole(fn))
}

// HomeNetns opens the network namespace that this process's threads run
// in: that of any thread no InNetnsFD or EnterNetnsFDHome call holds.
// (InNetnsFD restores or retires every thread it moves, EnterNetnsFDHome
// restores its thread or ends the process, and the Go runtime starts new threads from
// a thread of its own when the one asking is locked, so a thread that runs
// other goroutines is always there.) It looks from a new goroutine, which
// never runs on a thread that either holds; /proc/self/ns/net instead names
// the main thread's namespace, which is a pod's while fn runs on the main
// thread.
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

// EnterNetnsFDHome runs fn as an InNetnsFunc does, inside the namespace
// nsfd, on the calling goroutine: it locks the goroutine to its thread,
// moves the thread into nsfd, and moves it back to homefd, the process's own
// network namespace as HomeNetns opened it, when fn calls leave or returns
// (or panics), unlocking it again. The caller must not be inside another
// namespace's function. It needs CAP_SYS_ADMIN.
//
// Unlike InNetnsFD, which runs fn on a goroutine of its own, nothing is
// handed to another goroutine: gozt bench's shared scenario makes every
// pod's socket this way, and a dial run on a goroutine of its own cost
// about 1.5× the CPU of the same dial on the caller's
// (BenchmarkDialInNetns). Going back to homefd rather than to the
// namespace the thread was found in saves opening /proc/thread-self/ns/net
// on every call, a path walk through procfs that cost more than both
// setns(2) calls together; the two are the same (see HomeNetns).
//
// If the thread cannot be moved back, EnterNetnsFDHome ends the process
// (noWayHome): the calling goroutine would otherwise go on in the pod's
// namespace and make its later sockets there, and a panic would not do, as
// a proxy's connection handlers recover from panics and their goroutines go
// on serving. setns(2) into a namespace file that is held open fails only
// for want of kernel memory (ztunnel too treats it as something that must
// never fail, with a panic its tasks unwind from).
func EnterNetnsFDHome(nsfd, homefd int, fn func(leave func() error) error) error {
	runtime.LockOSThread()
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("sockopt: enter netns: %w", err)
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

// InNetnsPath returns the InNetnsFunc of the network namespace at path,
// which it opens on every call, as InNetns does.
func InNetnsPath(path string) InNetnsFunc {
	return func(fn func(leave func() error) error) error {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("sockopt: open netns: %w", err)
		}
		defer f.Close()
		return inNetns(int(f.Fd()), fn)
	}
}

// inNetns runs fn inside nsfd on a goroutine of its own, whose thread goes
// back to the namespace it was in.
func inNetns(nsfd int, fn func(leave func() error) error) error {
	done := make(chan netnsResult, 1)
	go runInNetns(nsfd, fn, done)
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

// runInNetns is inNetns's goroutine: it enters the namespace, runs fn and
// moves the thread back to the namespace it was in when fn calls leave or
// returns. A thread that cannot be moved back stays locked, so the runtime
// ends it when the goroutine exits.
func runInNetns(nsfd int, fn func(leave func() error) error, done chan<- netnsResult) {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread() // never left
		done <- netnsResult{err: fmt.Errorf("sockopt: open current netns: %w", err)}
		return
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		unix.Close(orig)
		runtime.UnlockOSThread()
		done <- netnsResult{err: fmt.Errorf("sockopt: enter netns: %w", err)}
		return
	}

	left := false
	var leaveErr error
	leave := func() error {
		if left {
			return leaveErr
		}
		left = true
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			leaveErr = fmt.Errorf("sockopt: restore netns: %w", err)
			return leaveErr
		}
		runtime.UnlockOSThread()
		return nil
	}
	r := callNetnsFunc(fn, leave)
	if !left {
		if err := leave(); err != nil {
			r.err = fmt.Errorf("%w (after fn returned %v)", err, r.err)
		}
	} else if leaveErr != nil && r.err == nil && !r.panicked {
		r.err = leaveErr
	}
	// Closed before the result goes out, not deferred behind it: the
	// caller, once it has the result, counts on every descriptor this
	// goroutine opened being free again (at its descriptor limit, the
	// next socket it makes needs one).
	unix.Close(orig)
	done <- r
	if hook := testHookNetnsSent.Load(); hook != nil {
		(*hook)()
	}
}

// testHookNetnsSent, if set, runs on runInNetns's goroutine once it has
// sent its result.
var testHookNetnsSent atomic.Pointer[func()]

// callNetnsFunc calls fn, turning a panic into a result so the thread can be
// restored before the panic goes on.
func callNetnsFunc(fn func(leave func() error) error, leave func() error) (r netnsResult) {
	defer func() {
		if v := recover(); v != nil {
			r = netnsResult{panicked: true, panicValue: v}
		}
	}()
	return netnsResult{err: fn(leave)}
}
