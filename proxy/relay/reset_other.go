//go:build !linux

package relay

import "net"

// resetAtEOF reports whether c, whose Read has just returned EOF, was in fact
// reset. Only Linux can tell (reset_linux.go); elsewhere an EOF is an EOF.
func resetAtEOF(net.Conn) bool { return false }
