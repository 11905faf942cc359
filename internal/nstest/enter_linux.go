package nstest

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/proxy/netns"
)

// InNetns runs fn with its goroutine inside the network namespace at path
// (for example /run/netns/NAME or /proc/PID/ns/net) and returns fn's error.
// See InNetnsFD.
func InNetns(path string, fn func() error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("nstest: open netns: %w", err)
	}
	defer f.Close()
	return InNetnsFD(int(f.Fd()), fn)
}

// InNetnsFD runs fn inside the network namespace that the open file
// descriptor nsfd refers to and returns fn's error. It is the tests' way in,
// not production's (netns.Handle): fn runs on a goroutine of its own,
// locked to its OS thread, which setns(2) moves into the namespace and back
// to the namespace it was found in afterwards, so the calling goroutine's
// thread is never touched, whatever namespace the caller is in. Sockets fn
// makes belong to the namespace for their whole life; goroutines fn starts
// do not run in it. If the thread cannot be moved back it is not reused:
// the goroutine exits still locked, and the Go runtime ends the thread. A
// panic in fn is re-raised on the calling goroutine after the thread is
// restored.
func InNetnsFD(nsfd int, fn func() error) error {
	return inNetns(nsfd, netns.Whole(fn))
}

// InNetnsPath returns a netns.Func for the network namespace at path, which
// it opens on every call, as InNetns does.
func InNetnsPath(path string) netns.Func {
	return func(fn func(leave func() error) error) error {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("nstest: open netns: %w", err)
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
		done <- netnsResult{err: fmt.Errorf("nstest: open current netns: %w", err)}
		return
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		unix.Close(orig)
		runtime.UnlockOSThread()
		done <- netnsResult{err: fmt.Errorf("nstest: enter netns: %w", err)}
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
			leaveErr = fmt.Errorf("nstest: restore netns: %w", err)
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

// HoldNetnsGoroutine makes InNetnsFD's goroutine wait, once it has handed
// its result to the caller, until release is called, so that a test sees
// what that goroutine still holds when InNetnsFD returns.
func HoldNetnsGoroutine() (release func()) {
	ch := make(chan struct{})
	hook := func() { <-ch }
	testHookNetnsSent.Store(&hook)
	var once sync.Once
	return func() { once.Do(func() { testHookNetnsSent.Store(nil); close(ch) }) }
}

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
