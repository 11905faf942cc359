//go:build !linux

package relay

import (
	"net"
	"syscall"
)

// pushSupported reports whether sources may push into TCP sockets; only the
// Linux build has the raw socket calls that needs.
const pushSupported = false

func (s *tcpSink) tryFD(fd uintptr) bool { return true }

// sockReader is not available here: directions read with a buffer in hand,
// and newSockReader makes none, so rc, which a Poller parks, is never set.
type sockReader struct{ rc syscall.RawConn }

func newSockReader(*net.TCPConn) *sockReader { return nil }

func (r *sockReader) read(int, bool) ([]byte, int, error) { return nil, 0, errWouldBlock }
