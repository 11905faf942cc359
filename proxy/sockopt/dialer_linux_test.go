package sockopt_test

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/sockopt"
)

// withControl returns d with fn run on each socket after d's own Control.
func withControl(d *net.Dialer, fn func(fd int) error) *net.Dialer {
	orig := d.Control
	d.Control = func(network, address string, rc syscall.RawConn) error {
		if orig != nil {
			if err := orig(network, address, rc); err != nil {
				return err
			}
		}
		var err error
		if cerr := rc.Control(func(fd uintptr) { err = fn(int(fd)) }); cerr != nil {
			return cerr
		}
		return err
	}
	return d
}

// TestDialerSetsBindAddressNoPort checks that a Dialer with a source
// address sets IP_BIND_ADDRESS_NO_PORT on its IPv4 and IPv6 sockets before
// the bind (so connect picks the port), and that the connection still
// comes from that source.
func TestDialerSetsBindAddressNoPort(t *testing.T) {
	for _, tc := range []struct{ network, listen, src string }{
		{"tcp4", "127.0.0.1:0", randomLoopback().String()},
		{"tcp6", "[::1]:0", "::1"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			src := netip.MustParseAddr(tc.src)
			noPort := -1
			d := withControl(sockopt.Dialer(src, sockopt.Options{}), func(fd int) (err error) {
				noPort, err = unix.GetsockoptInt(fd, unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT)
				return err
			})
			_, s := loopbackConn(t, tc.network, tc.listen, d)
			if noPort != 1 {
				t.Errorf("IP_BIND_ADDRESS_NO_PORT on the dial socket = %d, want 1", noPort)
			}
			if got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != src {
				t.Errorf("server sees source %v, want %v", got, src)
			}
		})
	}
}

// TestDial: sockopt.Dial connects from the Dialer's source, with its options
// set before the bind and the socket's family named in the network its
// Control sees, on IPv4 and IPv6; without a source it binds nothing and the
// kernel picks the source at connect.
func TestDial(t *testing.T) {
	for _, tc := range []struct{ network, listen, src string }{
		{"tcp4", "127.0.0.1:0", randomLoopback().String()},
		{"tcp6", "[::1]:0", "::1"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.listen)
			if err != nil {
				t.Skipf("cannot listen on %s %s: %v", tc.network, tc.listen, err)
			}
			defer ln.Close()
			dst := ln.Addr().(*net.TCPAddr).AddrPort()
			for _, src := range []netip.Addr{netip.MustParseAddr(tc.src), {}} {
				noPort, network := -1, ""
				d := sockopt.Dialer(src, sockopt.Options{Mark: 0, UserTimeout: time.Second})
				orig := d.Control
				d.Control = func(nw, address string, rc syscall.RawConn) error {
					network = nw
					if err := orig(nw, address, rc); err != nil {
						return err
					}
					return rc.Control(func(fd uintptr) {
						noPort, _ = unix.GetsockoptInt(int(fd), unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT)
					})
				}
				c, err := sockopt.Dial(context.Background(), d, dst)
				if err != nil {
					t.Fatalf("Dial from %v: %v", src, err)
				}
				s, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
				s.Close()
				c.Close()
				if network != tc.network {
					t.Errorf("from %v: Control saw network %q, want %q", src, network, tc.network)
				}
				wantNoPort := 0
				if src.IsValid() {
					wantNoPort = 1
					if got != src {
						t.Errorf("server sees source %v, want %v", got, src)
					}
				}
				if noPort != wantNoPort {
					t.Errorf("from %v: IP_BIND_ADDRESS_NO_PORT = %d, want %d", src, noPort, wantNoPort)
				}
			}
		})
	}
}

// TestDialerSharesSourcePorts is the behaviour IP_BIND_ADDRESS_NO_PORT buys:
// connections from one source address to different destinations may share
// a source port, because connect needs only a unique 4-tuple, where a bind
// to port 0 needs a port that nothing on the address holds. With the
// socket's port range narrowed to 4 ports (IP_LOCAL_PORT_RANGE, Linux 6.3),
// 8 open connections to 8 servers must all succeed; binding the port before
// connect fails the fifth with EADDRINUSE.
func TestDialerSharesSourcePorts(t *testing.T) {
	const ports, servers = 4, 8
	lo := 40000 + rand.IntN(10000)
	portRange := uint32(lo) | uint32(lo+ports-1)<<16
	src := randomLoopback()
	d := withControl(sockopt.Dialer(src, sockopt.Options{}), func(fd int) error {
		err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, int(portRange))
		if err != nil {
			t.Skipf("IP_LOCAL_PORT_RANGE not supported: %v", err)
		}
		return nil
	})
	used := map[int]bool{}
	for i := range servers {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := d.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial %d of %d from %v with %d source ports: %v", i+1, servers, src, ports, err)
		}
		defer c.Close()
		la := c.LocalAddr().(*net.TCPAddr)
		if la.Port < lo || la.Port >= lo+ports {
			t.Skipf("source port %d outside the socket's range %d-%d: IP_LOCAL_PORT_RANGE not honoured", la.Port, lo, lo+ports-1)
		}
		if got := la.AddrPort().Addr(); got != src {
			t.Errorf("connection %d comes from %v, want %v", i, got, src)
		}
		used[la.Port] = true
	}
	if len(used) > ports {
		t.Errorf("used %d source ports, more than the %d in range", len(used), ports)
	}
	t.Logf("%d connections from %v used source ports %v", servers, src, used)
}

// sourceOpts are the options a dial socket had after Control.
type sourceOpts struct{ transparent, freebind, noPort int }

// recordSourceOptions returns d with its sockets' options recorded in *got.
func recordSourceOptions(d *net.Dialer, v6 bool, got *sourceOpts) *net.Dialer {
	return withControl(d, func(fd int) (err error) {
		level, tOpt, fOpt := unix.SOL_IP, unix.IP_TRANSPARENT, unix.IP_FREEBIND
		if v6 {
			level, tOpt, fOpt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT, unix.IPV6_FREEBIND
		}
		if got.transparent, err = unix.GetsockoptInt(fd, level, tOpt); err != nil {
			return err
		}
		if got.freebind, err = unix.GetsockoptInt(fd, level, fOpt); err != nil {
			return err
		}
		got.noPort, err = unix.GetsockoptInt(fd, unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT)
		return err
	})
}

// TestDialerSourceOptions checks the options on a source-binding dial
// socket for a local source: with CAP_NET_ADMIN, IP_TRANSPARENT and
// IP_FREEBIND as SPEC §2.5 puts on every source-preserving socket (so no
// locality check is needed); without it, none of them, and the dial still
// binds the local source. IP_BIND_ADDRESS_NO_PORT is set either way.
func TestDialerSourceOptions(t *testing.T) {
	for _, tc := range []struct{ network, listen, src string }{
		{"tcp4", "127.0.0.1:0", randomLoopback().String()},
		{"tcp6", "[::1]:0", "::1"},
	} {
		src := netip.MustParseAddr(tc.src)
		v6 := tc.network == "tcp6"
		t.Run(tc.network+"/privileged", func(t *testing.T) {
			nstest.RequireRoot(t)
			var got sourceOpts
			_, s := loopbackConn(t, tc.network, tc.listen, recordSourceOptions(sockopt.Dialer(src, sockopt.Options{}), v6, &got))
			if want := (sourceOpts{1, 1, 1}); got != want {
				t.Errorf("dial socket options (transparent, freebind, no-port) = %v, want %v", got, want)
			}
			if a := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); a != src {
				t.Errorf("server sees source %v, want %v", a, src)
			}
		})
		t.Run(tc.network+"/unprivileged", func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.listen)
			if err != nil {
				t.Skipf("cannot listen on %s: %v", tc.listen, err)
			}
			defer ln.Close()
			var got sourceOpts
			d := recordSourceOptions(sockopt.Dialer(src, sockopt.Options{}), v6, &got)
			var c net.Conn
			withoutNetAdmin(t, func() { c, err = d.Dial(tc.network, ln.Addr().String()) })
			if err != nil {
				t.Fatalf("dial from local %v without CAP_NET_ADMIN: %v", src, err)
			}
			defer c.Close()
			if want := (sourceOpts{0, 0, 1}); got != want {
				t.Errorf("dial socket options (transparent, freebind, no-port) = %v, want %v", got, want)
			}
			if a := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); a != src {
				t.Errorf("connection comes from %v, want %v", a, src)
			}
		})
	}
}

// TestDialKeepAlive reads back the keep-alive settings of connections
// sockopt.Dial and DialInNetns make: every field, the ones equal to Go's
// defaults included, and a Dialer that turns it off.
func TestDialKeepAlive(t *testing.T) {
	dst := loopbackSink(t)
	for _, tc := range []struct {
		name string
		d    func() *net.Dialer
		want [4]int // on, idle, interval, count
	}{
		{"ztunnel", func() *net.Dialer {
			return sockopt.Dialer(netip.Addr{}, sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}})
		}, [4]int{1, 180, 180, 9}},
		{"go defaults", func() *net.Dialer {
			return sockopt.Dialer(randomLoopback(), sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true}})
		}, [4]int{1, 15, 15, 9}},
		{"every field", func() *net.Dialer {
			return sockopt.Dialer(netip.Addr{}, sockopt.Options{KeepAlive: net.KeepAliveConfig{Enable: true, Idle: 1500 * time.Millisecond, Interval: 21 * time.Second, Count: 3}})
		}, [4]int{1, 2, 21, 3}},
		{"dialer idle only", func() *net.Dialer { return &net.Dialer{KeepAlive: 30 * time.Second} }, [4]int{1, 30, 15, 9}},
		{"off", func() *net.Dialer { return sockopt.Dialer(netip.Addr{}, sockopt.Options{}) }, [4]int{0, -1, -1, -1}},
	} {
		for _, dial := range dials {
			t.Run(dial.name+"/"+tc.name, func(t *testing.T) {
				c, err := dial.fn(t.Context(), tc.d(), dst)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				got := keepAliveOf(t, c)
				if tc.want[0] == 0 {
					got = [4]int{got[0], -1, -1, -1}
				}
				if got != tc.want {
					t.Errorf("keep-alive (on, idle, interval, count) = %v, want %v", got, tc.want)
				}
			})
		}
	}
}
