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

// runInNetns is InNetnsFD's goroutine: it enters the namespace, runs fn and
// restores the thread's original namespace.
func runInNetns(nsfd int, fn func() error, done chan<- netnsResult) {
	runtime.LockOSThread()
	restored := false
	defer func() {
		if restored {
			runtime.UnlockOSThread()
		}
	}()

	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		restored = true // never left
		done <- netnsResult{err: fmt.Errorf("sockopt: open current netns: %w", err)}
		return
	}
	defer unix.Close(orig)
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
