package relay

import (
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resetAtEOF reports whether c, whose Read has just returned EOF, was in fact
// reset by its peer.
//
// Linux reports a reset once per socket: the first system call to see it
// returns ECONNRESET and later reads return 0, like a FIN. The opposite
// direction of a copy writes to the same socket, so its write may take the
// ECONNRESET and leave this direction an EOF, which would otherwise be
// passed on as an orderly FIN and hide a truncated stream (TESTPLAN F15).
// A socket that received a FIN and has not shut down its own write side is
// in CLOSE_WAIT; one that was reset is CLOSED. The caller checks only while
// this side has not shut down its write side (after which CLOSED is normal).
//
// A socket that has been closed under the read (the opposite direction
// failed and aborted the pair, or the caller closed it) also counts: its
// EOF must not be passed on as a FIN either.
func resetAtEOF(c net.Conn) bool {
	tcp := socketOf(c)
	if tcp == nil {
		return false
	}
	rc, err := tcp.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	err = rc.Control(func(fd uintptr) { closed = tcpStateClosed(fd) })
	return err != nil || closed
}

// tcpStateClosed reports whether the socket is in the CLOSED state. It asks
// for the first byte of TCP_INFO only, tcpi_state (the kernel copies as
// much of the struct as it is given room for), into a buffer on the stack:
// unix.GetsockoptTCPInfo allocates the whole 280-byte struct, once per
// direction's EOF of every connection.
func tcpStateClosed(fd uintptr) bool {
	var state [1]byte
	n := uint32(len(state))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&state[0])), uintptr(unsafe.Pointer(&n)), 0)
	// BPF_TCP_* are the kernel's TCP states (include/net/tcp_states.h).
	return errno == 0 && n == 1 && state[0] == unix.BPF_TCP_CLOSE
}
