//go:build !linux

package sockwait

// supported reports whether sockets can park here: only Linux has the
// epoll set, and elsewhere every loop waits on its goroutine.
const supported = false

type epollSet struct{}

func (s *Set) startLocked() bool      { return false }
func (ep *epollSet) arm(*Watch) error { return nil }
func (ep *epollSet) remove(*Watch)    {}
func (ep *epollSet) close() error     { return nil }
