package admin

import (
	"net"
	"net/http"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListenPlainTCP: the admin, metrics and readiness ports listen on a
// plain TCP socket, as ztunnel's do, not Go's default Multipath TCP.
func TestListenPlainTCP(t *testing.T) {
	s, err := listen(t.Context(), "127.0.0.1:0", http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())
	rc, err := s.ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var perr error
	if err := rc.Control(func(fd uintptr) { proto, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) }); err != nil || perr != nil {
		t.Fatal(err, perr)
	}
	if proto != unix.IPPROTO_TCP {
		t.Errorf("admin listener protocol %d, want TCP (%d), not MPTCP (%d)", proto, unix.IPPROTO_TCP, unix.IPPROTO_MPTCP)
	}
}
