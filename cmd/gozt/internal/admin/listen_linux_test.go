package admin

import (
	"net"
	"net/http"
	"testing"

	"github.com/gozt/gozt/internal/nstest"
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
	proto, err := nstest.SocketProtocol(s.ln.(*net.TCPListener))
	if err != nil {
		t.Fatal(err)
	}
	if proto != unix.IPPROTO_TCP {
		t.Errorf("admin listener protocol %d, want TCP (%d), not MPTCP (%d)", proto, unix.IPPROTO_TCP, unix.IPPROTO_MPTCP)
	}
}
