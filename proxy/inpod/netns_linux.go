package inpod

import (
	"fmt"
	"os"
	"syscall"

	"github.com/gozt/gozt/proxy/sockopt"
)

// OpenNetns opens the network namespace at path, such as /proc/self/ns/net
// or /run/netns/NAME.
func OpenNetns(path string) (*Netns, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapErr(fmt.Errorf("open netns: %w", err))
	}
	return NewNetns(f)
}

// NewNetns returns a Netns for the open namespace file f, taking ownership
// of f: it is closed by Netns.Close, or at once if NewNetns fails. It does
// not check that f is a network namespace; Run fails if it is not.
func NewNetns(f *os.File) (*Netns, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, wrapErr(fmt.Errorf("stat netns: %w", err))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		f.Close()
		return nil, wrapErr(fmt.Errorf("stat netns %s: no inode", f.Name()))
	}
	home, err := sockopt.HomeNetns()
	if err != nil {
		f.Close()
		return nil, wrapErr(err)
	}
	return &Netns{f: f, home: home, inode: st.Ino, dev: st.Dev}, nil
}

// Run calls fn on a thread inside the namespace and returns fn's error
// (sockopt.EnterNetnsFDHome, returning the thread to the process's own
// namespace as opened by NewNetns): sockets fn creates stay in the
// namespace, goroutines it starts do not. It needs CAP_SYS_ADMIN.
func (n *Netns) Run(fn func() error) error {
	return n.Enter(func(func() error) error { return fn() })
}

// Enter is Run for a fn that may leave the namespace before it returns, as
// a sockopt.InNetnsFunc's may.
func (n *Netns) Enter(fn func(leave func() error) error) error {
	rc, err := n.f.SyscallConn()
	if err != nil {
		return wrapErr(fmt.Errorf("netns fd: %w", err))
	}
	hc, err := n.home.SyscallConn()
	if err != nil {
		return wrapErr(fmt.Errorf("own netns fd: %w", err))
	}
	// Control holds a reference on each fd, so a concurrent Close cannot
	// recycle a descriptor number under setns.
	var runErr error
	err = rc.Control(func(fd uintptr) {
		herr := hc.Control(func(home uintptr) { runErr = sockopt.EnterNetnsFDHome(int(fd), int(home), fn) })
		if herr != nil {
			runErr = wrapErr(fmt.Errorf("own netns fd: %w", herr))
		}
	})
	if err != nil {
		return wrapErr(fmt.Errorf("netns fd: %w", err))
	}
	return runErr
}
