package proxy

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// TryRead reads what the downstream socket already holds, without waiting:
// (0, nil) when it holds nothing. hbone's ConnectEarly sends it in the
// CONNECT's own write (hbone.EarlySource).
func (e *earlySource) TryRead(p []byte) (int, error) {
	tc, ok := e.Conn.(*net.TCPConn)
	if !ok || len(p) == 0 {
		return 0, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, nil
	}
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, rerr = syscall.Read(int(fd), p) // the socket is non-blocking
		return true                        // one attempt, never a wait
	}); err != nil {
		return 0, nil // closed or past a deadline: Read will tell
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EINTR):
		return 0, nil
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: tc.LocalAddr(), Addr: tc.RemoteAddr(), Err: rerr}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
