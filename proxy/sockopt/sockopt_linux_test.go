package sockopt_test

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/sockopt"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// loopbackConn returns both ends of a TCP connection to a listener on addr.
func loopbackConn(t *testing.T, network, addr string, d *net.Dialer) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("cannot listen on %s %s: %v", network, addr, err)
	}
	return connTo(t, network, ln, d)
}

// connTo dials ln over network with d (nil: a zero Dialer), accepts, and
// returns both ends, closed when the test ends. It closes ln.
func connTo(t *testing.T, network string, ln net.Listener, d *net.Dialer) (dialed, accepted *net.TCPConn) {
	t.Helper()
	defer ln.Close()
	if d == nil {
		d = &net.Dialer{}
	}
	c, err := d.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatalf("dial %s: %v", ln.Addr(), err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestOriginalDstNotRedirected: a connection no NAT rule touched has no
// original destination, and that is not an error.
func TestOriginalDstNotRedirected(t *testing.T) {
	for _, tc := range []struct{ network, addr string }{
		{"tcp4", "127.0.0.1:0"},
		{"tcp6", "[::1]:0"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			_, s := loopbackConn(t, tc.network, tc.addr, nil)
			dst, ok, err := sockopt.OriginalDst(s)
			if ok || err != nil {
				t.Errorf("OriginalDst(not redirected) = %v, %v, %v; want ok=false, nil error", dst, ok, err)
			}
		})
	}
}

// TestDialerSource checks the source address a Dialer binds: a local src is
// bound as is (the server sees it), an invalid src binds nothing.
func TestDialerSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  netip.Addr
		want netip.Addr
	}{
		{"local", netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.2")},
		{"mapped", netip.MustParseAddr("::ffff:127.0.0.3"), netip.MustParseAddr("127.0.0.3")},
		{"none", netip.Addr{}, netip.MustParseAddr("127.0.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := sockopt.Dialer(tc.src, sockopt.Options{})
			if d.Timeout != 10*time.Second {
				t.Errorf("Dialer timeout = %v, want 10s", d.Timeout)
			}
			_, s := loopbackConn(t, "tcp4", "127.0.0.1:0", d)
			got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			if got != tc.want {
				t.Errorf("server sees source %v, want %v", got, tc.want)
			}
		})
	}
}

// TestListenConfigReusePort: with ReusePort two listeners share a port;
// without it the second fails.
func TestListenConfigReusePort(t *testing.T) {
	ctx := t.Context()
	lc := sockopt.ListenConfig(sockopt.Options{ReusePort: true})
	l1, err := lc.Listen(ctx, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("first listener: %v", err)
	}
	defer l1.Close()
	l2, err := lc.Listen(ctx, "tcp4", l1.Addr().String())
	if err != nil {
		t.Fatalf("second listener on %v with ReusePort: %v", l1.Addr(), err)
	}
	l2.Close()

	plain := sockopt.ListenConfig(sockopt.Options{})
	if l3, err := plain.Listen(ctx, "tcp4", l1.Addr().String()); !errors.Is(err, unix.EADDRINUSE) {
		if l3 != nil {
			l3.Close()
		}
		t.Errorf("listener on %v without ReusePort: err = %v, want EADDRINUSE", l1.Addr(), err)
	}
}

// TestListenConfigPlainTCP: the listeners are plain TCP sockets, as
// ztunnel's are, whatever Go's default (Multipath TCP listeners since Go
// 1.24, where the kernel has net.mptcp.enabled, as this one may).
func TestListenConfigPlainTCP(t *testing.T) {
	for _, o := range []sockopt.Options{{}, {KeepAlive: net.KeepAliveConfig{Enable: true}}} {
		lc := sockopt.ListenConfig(o)
		ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		proto, err := nstest.SocketProtocol(ln.(*net.TCPListener))
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
		if proto != unix.IPPROTO_TCP {
			t.Errorf("options %+v: listener protocol %d, want TCP (%d), not MPTCP (%d)", o, proto, unix.IPPROTO_TCP, unix.IPPROTO_MPTCP)
		}
	}
}

func TestIsLocal(t *testing.T) {
	v6 := hasIPv6Loopback()
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.0.0.2", true}, // inside lo's 127.0.0.0/8 local route
		{"::ffff:127.0.0.1", true},
		{"192.0.2.77", false}, // TEST-NET-1, never assigned
		{"2001:db8::77", false},
		{"::1", true},
		{"::1%lo", true}, // the zone must resolve, but only link-local binds use it
		{"::1%1", true},  // a numeric zone is an interface index (lo is always 1)
		{"::1%gozt-none0", false},
		{"fe80::1", false}, // link-local without a zone never binds
		{"0.0.0.0", false},
		{"::", false},
		{"224.0.0.1", false},
		{"255.255.255.255", false},
	} {
		ip := netip.MustParseAddr(tc.ip)
		if tc.want && ip.Is6() && !ip.Is4In6() && !v6 {
			t.Logf("skipping IsLocal(%s): no IPv6 loopback", tc.ip)
			continue
		}
		if got := sockopt.IsLocal(ip); got != tc.want {
			t.Errorf("IsLocal(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
	if sockopt.IsLocal(netip.Addr{}) {
		t.Error("IsLocal(invalid) = true")
	}
}

// hasIPv6Loopback reports whether ::1 can be listened on (IPv6 may be
// disabled in a container).
func hasIPv6Loopback() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// keepAliveOf reads a socket's keep-alive settings: SO_KEEPALIVE,
// TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT.
func keepAliveOf(t *testing.T, c *net.TCPConn) [4]int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out [4]int
	var gerr error
	opts := [4][2]int{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}, {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
	}
	if err := rc.Control(func(fd uintptr) {
		for i, o := range opts {
			if out[i], gerr = unix.GetsockoptInt(int(fd), o[0], o[1]); gerr != nil {
				return
			}
		}
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return out
}

// optionsConn returns both ends of a TCP connection on 127.0.0.1, its
// listener from sockopt.ListenConfig(o) and its dialer sockopt.Dialer with
// o, closed when the test ends.
func optionsConn(t *testing.T, o sockopt.Options) (dialed, accepted *net.TCPConn) {
	t.Helper()
	lc := sockopt.ListenConfig(o)
	ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return connTo(t, "tcp4", ln, sockopt.Dialer(netip.Addr{}, o))
}

// TestKeepAlive checks that Options.KeepAlive reaches dialed and accepted
// sockets as configured, and that its zero value leaves keep-alive off.
func TestKeepAlive(t *testing.T) {
	ztunnel := net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}
	for _, tc := range []struct {
		name string
		ka   net.KeepAliveConfig
		want [4]int
	}{
		{"ztunnel defaults", ztunnel, [4]int{1, 180, 180, 9}},
		{"off", net.KeepAliveConfig{}, [4]int{0, -1, -1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := optionsConn(t, sockopt.Options{KeepAlive: tc.ka})
			for side, conn := range map[string]*net.TCPConn{"dialed": c, "accepted": s} {
				got := keepAliveOf(t, conn)
				if got[0] != tc.want[0] {
					t.Errorf("%s: SO_KEEPALIVE = %d, want %d", side, got[0], tc.want[0])
				}
				if tc.want[0] == 1 && got != tc.want {
					t.Errorf("%s: keep-alive (on, idle, interval, count) = %v, want %v", side, got, tc.want)
				}
			}
		})
	}
}

// userTimeoutOf reads a socket's TCP_USER_TIMEOUT in milliseconds.
func userTimeoutOf(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return ms
}

// TestUserTimeout checks that Options.UserTimeout reaches dialed sockets and
// the sockets a listener accepts (by inheritance from the listener), as
// ztunnel sets TCP_USER_TIMEOUT on upstream and captured sockets; zero
// leaves the kernel's default (0, off). ztunnel's USER_TIMEOUT_ENABLED
// with its keep-alive defaults is 180 s + 9 × 180 s.
func TestUserTimeout(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ut     time.Duration
		wantMS int
	}{
		{"ztunnel defaults", 180*time.Second + 9*180*time.Second, 1_800_000},
		{"rounded up", 1500 * time.Microsecond, 2},
		{"off", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := optionsConn(t, sockopt.Options{UserTimeout: tc.ut, KeepAlive: net.KeepAliveConfig{Enable: true}})
			for side, conn := range map[string]*net.TCPConn{"dialed": c, "accepted": s} {
				if got := userTimeoutOf(t, conn); got != tc.wantMS {
					t.Errorf("%s: TCP_USER_TIMEOUT = %d ms, want %d", side, got, tc.wantMS)
				}
			}
		})
	}
}
