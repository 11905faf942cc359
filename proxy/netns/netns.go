// Package netns runs code inside a pod's network namespace, the one way gozt
// makes a pod's sockets: a thread enters the namespace with setns(2), the
// sockets it makes there belong to the namespace for their whole life, and
// the thread returns to the process's own namespace (Home) before anything
// else runs on it. A Handle is an open namespace (a file descriptor istio-cni
// sent over ZDS, or a path), and a Func is what a proxy is handed to make its
// listeners and upstream sockets inside one.
//
// Everything here is Linux-only and needs CAP_SYS_ADMIN; on other systems
// the functions return an error wrapping errors.ErrUnsupported
// (netns_other.go). Tests that want a namespace by path on a goroutine of
// their own use internal/nstest, not this package.
package netns

import (
	"os"
)

// Func runs fn on the calling goroutine, locked to a thread inside a
// network namespace, and returns fn's error; sockets that fn makes belong
// to that namespace for their whole life, goroutines it starts do not. fn
// may call leave to move the thread back to the process's own namespace
// before it returns: fn then goes on, and may wait, as any goroutine does,
// and sockets it makes from then on are made outside. If leave fails, fn
// must make no more sockets and return leave's error. sockopt.DialInNetns
// leaves once its socket exists, so that the connect is not waited for on a
// locked thread.
type Func func(fn func(leave func() error) error) error

// Run calls fn with all of it inside the namespace.
func (in Func) Run(fn func() error) error { return in(Whole(fn)) }

// Whole is fn as the argument of a Func that never leaves early.
func Whole(fn func() error) func(leave func() error) error {
	return func(func() error) error { return fn() }
}

// Handle is an open handle on a pod's network namespace: a file descriptor
// received from istio-cni by SCM_RIGHTS, or one opened from a path. Two
// handles name the same namespace when their inode and device match (SPEC
// §9, "compared by the fd's inode+device").
//
// A Handle may be used from several goroutines; Close must come after every
// Run and Enter has returned.
type Handle struct {
	f     *os.File
	home  *os.File // the process's own network namespace (processHome), which Enter returns to; shared
	inode uint64
	dev   uint64
}

// Inode returns the inode number of the namespace file.
func (h *Handle) Inode() uint64 { return h.inode }

// Same reports whether h and o refer to the same namespace (same inode and
// device). A nil Handle is the same as nothing.
func (h *Handle) Same(o *Handle) bool {
	if h == nil || o == nil {
		return false
	}
	return h.inode == o.inode && h.dev == o.dev
}

// Close closes the namespace file. The process's own namespace stays open
// for the other handles.
func (h *Handle) Close() error { return h.f.Close() }
