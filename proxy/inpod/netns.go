package inpod

import (
	"errors"
	"os"
)

// Netns is an open handle on a pod's network namespace: a file descriptor
// received from istio-cni by SCM_RIGHTS, or one opened from a path. Two
// handles name the same namespace when their inode and device match (SPEC
// §9, "compared by the fd's inode+device").
//
// A Netns may be used from several goroutines; Close must come after every
// Run has returned.
type Netns struct {
	f     *os.File
	home  *os.File // the process's own network namespace, which Run returns to
	inode uint64
	dev   uint64
}

// Inode returns the inode number of the namespace file.
func (n *Netns) Inode() uint64 { return n.inode }

// Same reports whether n and o refer to the same namespace (same inode and
// device). A nil Netns is the same as nothing.
func (n *Netns) Same(o *Netns) bool {
	if n == nil || o == nil {
		return false
	}
	return n.inode == o.inode && n.dev == o.dev
}

// Close closes the namespace file and NewNetns's handle on the process's
// own namespace.
func (n *Netns) Close() error {
	err := n.f.Close()
	if n.home != nil {
		err = errors.Join(err, n.home.Close())
	}
	return err
}
