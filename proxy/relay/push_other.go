//go:build !linux

package relay

import "net"

// pushSupported reports whether sources may push into TCP sockets; only the
// Linux build has the raw socket calls that needs.
const pushSupported = false

func (s *tcpSink) tryFD(fd uintptr) bool { return true }

// readWaiter is not available here: directions read with a buffer in hand.
type readWaiter struct{}

func newReadWaiter(*net.TCPConn) *readWaiter { return nil }

func (w *readWaiter) wait() error { return nil }
