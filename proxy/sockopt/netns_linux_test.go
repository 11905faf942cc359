package sockopt_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/sockopt"
)

// Tier-3 tests: real network namespaces, veth pairs, iptables rules. They
// need root and the ip/iptables tools; without them they skip with a loud
// message, unless GOZT_REQUIRE_ROOT=1 (CI), where they fail.

// uniqueName returns prefix plus random hex, unique per run; at most 15
// bytes with a short prefix, so it also fits interface names.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// namespace is a network namespace made for one test and deleted after it.
type namespace struct {
	name string
	path string
}

func newNetns(t testing.TB) namespace {
	t.Helper()
	name := nstest.NewNetns(t)
	return namespace{name: name, path: "/var/run/netns/" + name}
}

// exec runs a command inside the namespace, failing t if it fails.
func (ns namespace) exec(t testing.TB, args ...string) {
	t.Helper()
	nstest.Run(t, append([]string{"ip", "netns", "exec", ns.name}, args...)...)
}

// in runs fn inside ns with nstest.InNetns, failing t on error.
func (ns namespace) in(t testing.TB, fn func() error) {
	t.Helper()
	if err := nstest.InNetns(ns.path, fn); err != nil {
		t.Fatalf("in namespace %s: %v", ns.name, err)
	}
}

// link connects a and b with a veth pair and gives each end its addresses
// (CIDR strings, IPv6 ones added with nodad so they are usable at once). It
// returns the names of a's and b's ends.
func link(t testing.TB, a namespace, aAddrs []string, b namespace, bAddrs []string) (ifA, ifB string) {
	t.Helper()
	ifA, ifB = uniqueName("gza"), uniqueName("gzb")
	nstest.Run(t, "ip", "link", "add", ifA, "netns", a.name, "type", "veth", "peer", "name", ifB, "netns", b.name)
	for _, end := range []struct {
		ns    namespace
		ifc   string
		addrs []string
	}{{a, ifA, aAddrs}, {b, ifB, bAddrs}} {
		for _, addr := range end.addrs {
			args := []string{"ip", "-n", end.ns.name, "addr", "add", addr, "dev", end.ifc}
			if strings.Contains(addr, ":") {
				args = append(args, "nodad")
			}
			nstest.Run(t, args...)
		}
		nstest.Run(t, "ip", "-n", end.ns.name, "link", "set", end.ifc, "up")
	}
	return ifA, ifB
}

// acceptOne accepts one connection on ln in the background.
func acceptOne(ln net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		ch <- c
	}()
	return ch
}

// listen makes a TCP listener on addr inside ns, closed when t ends.
func (ns namespace) listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	ns.in(t, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	t.Cleanup(func() { ln.Close() })
	return ln
}

// checkEcho echoes from s, the accepted end of c, and checks that msg
// written on c comes back before EOF.
func checkEcho(t *testing.T, c *net.TCPConn, s net.Conn, msg string) {
	t.Helper()
	go func() {
		io.Copy(s, s)
		s.Close()
	}()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	c.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != msg {
		t.Errorf("echo = %q, %v; want %q", got, err, msg)
	}
}

// TestOriginalDstRedirected redirects connections with iptables/ip6tables
// nat REDIRECT rules, as istio-cni does for the outbound port (SPEC §1.3),
// and checks that OriginalDst recovers the destination before NAT: for IPv4
// and IPv6 listeners and for IPv4 traffic on a dual-stack listener (an
// IPv4-mapped socket).
func TestOriginalDstRedirected(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables", "ip6tables")
	client, server := newNetns(t), newNetns(t)
	link(t, client, []string{"10.99.1.1/24", "fd00:99:1::1/64"}, server, []string{"10.99.1.2/24", "fd00:99:1::2/64"})

	for _, tc := range []struct {
		name       string
		listenNet  string
		listenAddr string
		target     string // the destination the client dials, redirected to the listener
	}{
		{"ipv4", "tcp4", "0.0.0.0:0", "10.99.1.2:80"},
		{"ipv6", "tcp6", "[::]:0", "[fd00:99:1::2]:443"},
		{"ipv4-on-dual-stack", "tcp", "[::]:0", "10.99.1.2:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ln net.Listener
			client.in(t, func() (err error) {
				ln, err = net.Listen(tc.listenNet, tc.listenAddr)
				return err
			})
			defer ln.Close()
			port := ln.Addr().(*net.TCPAddr).Port
			target := netip.MustParseAddrPort(tc.target)
			iptables := "iptables"
			if target.Addr().Is6() {
				iptables = "ip6tables"
			}
			rule := []string{"-t", "nat", "-p", "tcp", "-d", target.Addr().String(),
				"--dport", fmt.Sprint(target.Port()), "-j", "REDIRECT", "--to-ports", fmt.Sprint(port)}
			client.exec(t, append([]string{iptables, "-A", "OUTPUT"}, rule...)...)
			defer client.exec(t, append([]string{iptables, "-D", "OUTPUT"}, rule...)...)

			accepted := acceptOne(ln)
			var c net.Conn
			client.in(t, func() (err error) {
				c, err = net.Dial("tcp", tc.target)
				return err
			})
			defer c.Close()
			s := <-accepted
			if s == nil {
				t.Fatal("accept failed")
			}
			defer s.Close()

			dst, ok, err := sockopt.OriginalDst(s.(*net.TCPConn))
			if err != nil || !ok || dst != target {
				t.Errorf("OriginalDst(redirected to %v) = %v, %v, %v; want %v, true, nil", s.LocalAddr(), dst, ok, err, target)
			}
		})
	}

	// In the same namespace, with a nat rule (so conntrack tracks every
	// connection), a connection that no rule redirected has a conntrack
	// entry naming its own destination, and still reports ok=false.
	t.Run("not-redirected", func(t *testing.T) {
		rule := []string{"-t", "nat", "-p", "tcp", "-d", "10.99.1.2", "--dport", "9", "-j", "REDIRECT", "--to-ports", "9"}
		client.exec(t, append([]string{"iptables", "-A", "OUTPUT"}, rule...)...)
		defer client.exec(t, append([]string{"iptables", "-D", "OUTPUT"}, rule...)...)
		var ln net.Listener
		client.in(t, func() (err error) {
			ln, err = net.Listen("tcp4", "10.99.1.1:0")
			return err
		})
		defer ln.Close()
		accepted := acceptOne(ln)
		var c net.Conn
		client.in(t, func() (err error) {
			c, err = net.Dial("tcp4", ln.Addr().String())
			return err
		})
		defer c.Close()
		s := <-accepted
		if s == nil {
			t.Fatal("accept failed")
		}
		defer s.Close()
		if dst, ok, err := sockopt.OriginalDst(s.(*net.TCPConn)); ok || err != nil {
			t.Errorf("OriginalDst(direct) = %v, %v, %v; want ok=false, nil", dst, ok, err)
		}
	})
}

// spoofMark is the SO_MARK that newSpoofPair's proxy namespace routes replies
// for: a socket that spoofs its source must carry it.
const spoofMark = 0x539

// newSpoofPair makes a proxy namespace (10.99.2.1) and a server namespace
// (10.99.2.2) joined by a veth pair, set up as istio-cni sets up a node
// (SPEC §1.3) for source spoofing from 10.99.0.0/24: the server routes that
// range to the proxy; the proxy marks the connections of sockets with
// SO_MARK spoofMark (→ connmark 0x111) and routes packets of marked
// connections to its local stack (table 100), so replies to a spoofed
// address come back to the socket.
func newSpoofPair(t testing.TB) (proxy, server namespace) {
	t.Helper()
	proxy, server = newNetns(t), newNetns(t)
	link(t, proxy, []string{"10.99.2.1/24"}, server, []string{"10.99.2.2/24"})
	nstest.Run(t, "ip", "-n", server.name, "route", "add", "10.99.0.0/24", "via", "10.99.2.1")
	proxy.exec(t, "iptables", "-t", "mangle", "-A", "OUTPUT", "-m", "mark", "--mark", fmt.Sprintf("%#x/0xfff", spoofMark),
		"-j", "CONNMARK", "--set-xmark", "0x111/0xfff")
	proxy.exec(t, "iptables", "-t", "mangle", "-A", "PREROUTING", "-m", "connmark", "--mark", "0x111/0xfff",
		"-j", "CONNMARK", "--restore-mark")
	nstest.Run(t, "ip", "-n", proxy.name, "rule", "add", "fwmark", "0x111/0xfff", "lookup", "100")
	nstest.Run(t, "ip", "-n", proxy.name, "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
	return proxy, server
}

// TestDialerSpoofsSource dials from a namespace with a source address no
// interface has (10.99.0.5) and checks that the server in another namespace
// sees that address, with newSpoofPair's istio-cni-like routing.
func TestDialerSpoofsSource(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables")
	proxy, server := newSpoofPair(t)

	spoofed := netip.MustParseAddr("10.99.0.5")
	ln := server.listen(t, "10.99.2.2:0")
	accepted := acceptOne(ln)

	var c net.Conn
	proxy.in(t, func() (err error) {
		if sockopt.IsLocal(spoofed) {
			return fmt.Errorf("IsLocal(%v) = true in the proxy namespace, want false", spoofed)
		}
		if !sockopt.IsLocal(netip.MustParseAddr("10.99.2.1")) {
			return errors.New("IsLocal(10.99.2.1) = false in the proxy namespace, want true")
		}
		c, err = sockopt.Dialer(spoofed, sockopt.Options{Mark: spoofMark}).Dial("tcp4", ln.Addr().String())
		return err
	})
	defer c.Close()
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	defer s.Close()

	if got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != spoofed {
		t.Errorf("server sees source %v, want the spoofed %v", got, spoofed)
	}
	// Bytes flow both ways over the spoofed connection.
	checkEcho(t, c.(*net.TCPConn), s, "spoofed hello")
}

// TestTransparentListener checks that a listener asked for Transparent has
// IP_TRANSPARENT (IPV6_TRANSPARENT) set and reports it, and that SO_MARK
// lands on the socket.
func TestTransparentListener(t *testing.T) {
	nstest.RequireRoot(t)
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "[::]:0"} {
		t.Run(addr, func(t *testing.T) {
			if probe, err := net.Listen("tcp", addr); err != nil {
				t.Skipf("cannot listen on %s: %v", addr, err)
			} else {
				probe.Close()
			}
			for _, transparent := range []bool{true, false} {
				lc := sockopt.ListenConfig(sockopt.Options{Transparent: transparent, Mark: 0x539})
				ln, err := lc.Listen(t.Context(), "tcp", addr)
				if err != nil {
					t.Fatalf("listen %s: %v", addr, err)
				}
				if got := sockopt.TransparentEnabled(ln); got != transparent {
					t.Errorf("TransparentEnabled(%s, Transparent=%v) = %v", addr, transparent, got)
				}
				if mark := soMark(t, ln.(*net.TCPListener)); mark != 0x539 {
					t.Errorf("SO_MARK on %s = %#x, want 0x539", addr, mark)
				}
				ln.Close()
			}
		})
	}
}

func soMark(t *testing.T, l *net.TCPListener) int {
	t.Helper()
	rc, err := l.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var gerr error
	if err := rc.Control(func(fd uintptr) { mark, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return mark
}

// TestWithoutNetAdmin checks the unprivileged paths: Transparent is best
// effort (the listener works, TransparentEnabled says false),
// RequireTransparent fails, and a spoofing Dialer fails with EPERM before it
// sends anything. As root the test drops CAP_NET_ADMIN and CAP_NET_RAW
// (either one allows IP_TRANSPARENT) on one locked thread.
func TestWithoutNetAdmin(t *testing.T) {
	withoutNetAdmin(t, func() {
		lc := sockopt.ListenConfig(sockopt.Options{Transparent: true})
		ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
		if err != nil {
			t.Errorf("best-effort Transparent listen: %v", err)
		} else {
			if sockopt.TransparentEnabled(ln) {
				t.Error("TransparentEnabled = true without CAP_NET_ADMIN")
			}
			ln.Close()
		}

		lc = sockopt.ListenConfig(sockopt.Options{RequireTransparent: true})
		ln, err = lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
		if err == nil {
			ln.Close()
			t.Error("RequireTransparent listen succeeded without CAP_NET_ADMIN")
		} else if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "IP_TRANSPARENT") {
			t.Errorf("RequireTransparent listen error = %v, want EPERM naming IP_TRANSPARENT", err)
		}

		d := sockopt.Dialer(netip.MustParseAddr("192.0.2.9"), sockopt.Options{})
		if c, err := d.Dial("tcp4", "127.0.0.1:9"); err == nil {
			c.Close()
			t.Error("spoofing dial succeeded without CAP_NET_ADMIN")
		} else if !errors.Is(err, unix.EPERM) {
			t.Errorf("spoofing dial error = %v, want EPERM", err)
		}
	})
}

// withoutNetAdmin runs fn without CAP_NET_ADMIN and CAP_NET_RAW. Not as root
// it just runs fn. As root it runs fn on a locked thread whose effective
// capabilities lack both (capabilities are per thread), and restores them after;
// fn must not start goroutines that make sockets.
func withoutNetAdmin(t *testing.T, fn func()) {
	if os.Geteuid() != 0 {
		fn()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			t.Errorf("capget: %v", err)
			runtime.UnlockOSThread()
			return
		}
		saved := data
		data[0].Effective &^= 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_NET_RAW
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			t.Errorf("capset: %v", err)
			runtime.UnlockOSThread()
			return
		}
		fn()
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			// Leave the thread locked: the runtime ends it with us.
			t.Errorf("restore capabilities: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
}

// TestIsLocalLinkLocal checks IsLocal on a zoned IPv6 link-local address,
// whose zone (an interface name or index) it resolves in the calling
// thread's namespace: the address is local only with the zone of the
// interface that has it.
func TestIsLocalLinkLocal(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	a, b := newNetns(t), newNetns(t)
	ifA, _ := link(t, a, []string{"fe80::99:1/64"}, b, []string{"fe80::99:2/64"})
	a.in(t, func() error {
		ifi, err := net.InterfaceByName(ifA)
		if err != nil {
			return err
		}
		for _, tc := range []struct {
			ip   string
			want bool
		}{
			{"fe80::99:1%" + ifA, true},
			{fmt.Sprintf("fe80::99:1%%%d", ifi.Index), true},
			{"fe80::99:1", false},    // a link-local bind needs a zone
			{"fe80::99:1%lo", false}, // not on that interface
			{"fe80::99:2%" + ifA, false},
			{"fe80::99:1%gozt-none0", false},
		} {
			if got := sockopt.IsLocal(netip.MustParseAddr(tc.ip)); got != tc.want {
				t.Errorf("IsLocal(%s) in namespace = %v, want %v", tc.ip, got, tc.want)
			}
		}
		return nil
	})
}
