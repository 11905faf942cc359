//go:build !linux

package relay

// parkSupported reports whether idle directions can park in a Poller: only
// the Linux build has the epoll set that needs, so elsewhere every pulled
// direction waits on a goroutine of its own.
const parkSupported = false

type epollSet struct{}

func (p *Poller) startLocked() bool { return false }
func (*epollSet) arm(*parker) error { return nil }
func (*epollSet) remove(*parker)    {}
func (*epollSet) close()            {}
