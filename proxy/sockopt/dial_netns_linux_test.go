package sockopt_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
)

// inNetnsFunc returns ns's netns.Func as tests make it
// (nstest.InNetnsPath: on a goroutine of its own).
func (ns namespace) inNetnsFunc() netns.Func { return nstest.InNetnsPath(ns.path) }

// enterFunc returns ns's netns.Func as production makes it, a
// netns.Handle's Enter (on the calling goroutine), with ns held open until
// tb ends.
func (ns namespace) enterFunc(tb testing.TB) netns.Func {
	tb.Helper()
	h, err := netns.Open(ns.path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	return h.Enter
}

// dials are the two ways to dial, for tests that check both alike.
var dials = []struct {
	name string
	fn   func(ctx context.Context, d *net.Dialer, dst netip.AddrPort) (*net.TCPConn, error)
}{
	{"Dial", sockopt.Dial},
	{"DialInNetns", func(ctx context.Context, d *net.Dialer, dst netip.AddrPort) (*net.TCPConn, error) {
		return sockopt.DialInNetns(ctx, here, d, dst)
	}},
}

// socketNetns returns the inode of the network namespace socket c belongs
// to (SIOCGSKNS).
func socketNetns(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	ino, err := nstest.SocketNetns(c)
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

// sockoptInt reads an integer socket option of c.
func sockoptInt(t *testing.T, c syscall.Conn, level, opt int) int {
	t.Helper()
	var v int
	var err error
	control(t, c, func(fd int) { v, err = unix.GetsockoptInt(fd, level, opt) })
	if err != nil {
		t.Fatalf("getsockopt(%d, %d): %v", level, opt, err)
	}
	return v
}

func control(t *testing.T, c syscall.Conn, fn func(fd int)) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(fd uintptr) { fn(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}

// TestDialInNetns dials with a spoofing Dialer from the proxy namespace of
// newSpoofPair while the test's own goroutine stays in the host netns: the
// socket is the proxy netns's, the Dialer's options and source took effect
// there (IsLocal was asked in the right namespace), TCP_NODELAY and the
// keep-alive are set as net.Dialer sets them, and bytes flow both ways.
func TestDialInNetns(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables")
	proxy, server := newSpoofPair(t)
	host := nstest.CurrentNetns(t)
	proxyIno := nstest.PathInode(t, proxy.path)

	ln := server.listen(t, "10.99.2.2:0")
	accepted := acceptOne(ln)

	spoofed := netip.MustParseAddr("10.99.0.5")
	ka := net.KeepAliveConfig{Enable: true, Idle: 170 * time.Second, Interval: 160 * time.Second, Count: 7}
	d := sockopt.Dialer(spoofed, sockopt.Options{Mark: spoofMark, KeepAlive: ka})
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	c, err := sockopt.DialInNetns(t.Context(), proxy.inNetnsFunc(), d, dst)
	if err != nil {
		t.Fatalf("DialInNetns: %v", err)
	}
	defer c.Close()
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	defer s.Close()

	if got := nstest.CurrentNetns(t); got != host {
		t.Errorf("caller's namespace changed from %d to %d", host, got)
	}
	if got := socketNetns(t, c); got != proxyIno {
		t.Errorf("socket is in namespace %d, want the proxy's %d", got, proxyIno)
	}
	if got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != spoofed {
		t.Errorf("server sees source %v, want the spoofed %v", got, spoofed)
	}
	if got := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != spoofed {
		t.Errorf("LocalAddr = %v, want %v", c.LocalAddr(), spoofed)
	}
	if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != dst {
		t.Errorf("RemoteAddr = %v, want %v", got, dst)
	}
	for _, o := range []struct {
		name       string
		level, opt int
		want       int
	}{
		{"SO_MARK", unix.SOL_SOCKET, unix.SO_MARK, spoofMark},
		{"TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY, 1},
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 170},
		{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 160},
		{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 7},
	} {
		if got := sockoptInt(t, c, o.level, o.opt); got != o.want {
			t.Errorf("%s = %d, want %d", o.name, got, o.want)
		}
	}
	checkEcho(t, c, s, "hello from the proxy netns")
}

// TestDialInNetnsLoopback dials listeners on the loopback of a namespace, which
// the host cannot reach, over IPv4 and IPv6, with a plain net.Dialer
// (keep-alive off) and a source port bound by LocalAddr.
func TestDialInNetnsLoopback(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	ns := newNetns(t)
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			ln := ns.listen(t, addr)
			accepted := acceptOne(ln)
			dst := ln.Addr().(*net.TCPAddr).AddrPort()
			d := &net.Dialer{KeepAlive: -1, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(dst.Addr(), 0))}
			c, err := sockopt.DialInNetns(t.Context(), ns.inNetnsFunc(), d, dst)
			if err != nil {
				t.Fatalf("DialInNetns(%v): %v", dst, err)
			}
			defer c.Close()
			if s := <-accepted; s != nil {
				s.Close()
			} else {
				t.Error("accept failed")
			}
			if got := sockoptInt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE); got != 0 {
				t.Errorf("SO_KEEPALIVE = %d with KeepAlive -1, want 0", got)
			}
		})
	}
}

// TestDialInNetnsErrors checks that failures come back as net.Dialer's
// would: *net.OpError wrapping the errno (the proxy tells a bind failure
// from others by it), timeouts that report Timeout, cancellation, and the
// error of inNetns itself.
func TestDialInNetnsErrors(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	ns := newNetns(t)
	// Packets to 10.99.3.2 go out on a veth, to a MAC address nobody has,
	// and vanish: a connect there waits until it is stopped.
	ifc, _ := link(t, ns, []string{"10.99.3.1/24"}, newNetns(t), nil)
	nstest.Run(t, "ip", "-n", ns.name, "neigh", "add", "10.99.3.2", "lladdr", "02:00:00:00:00:99", "dev", ifc, "nud", "permanent")
	blackhole := netip.MustParseAddrPort("10.99.3.2:80")
	refused := netip.MustParseAddrPort("127.0.0.1:1")
	errInNetns := errors.New("no such pod")

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		d       *net.Dialer
		inNetns netns.Func
		dst     netip.AddrPort
		check   func(error) bool
	}{
		{"refused", nil, &net.Dialer{}, nil, refused,
			func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }},
		{"source not local", nil, &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3)}}, nil, refused,
			func(err error) bool { return errors.Is(err, syscall.EADDRNOTAVAIL) }},
		{"context deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), 100*time.Millisecond)
		}, &net.Dialer{}, nil, blackhole, isTimeout},
		{"dialer timeout", nil, &net.Dialer{Timeout: 100 * time.Millisecond}, nil, blackhole, isTimeout},
		{"cancelled while connecting", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}, &net.Dialer{}, nil, blackhole, func(err error) bool { return errors.Is(err, context.Canceled) }},
		{"cancelled before", func() (context.Context, context.CancelFunc) { return cancelled, func() {} },
			&net.Dialer{}, func(func(func() error) error) error { panic("inNetns called with a cancelled context") }, refused,
			func(err error) bool { return errors.Is(err, context.Canceled) }},
		{"inNetns fails", nil, &net.Dialer{}, func(func(func() error) error) error { return errInNetns }, refused,
			func(err error) bool { return errors.Is(err, errInNetns) }},
		{"control fails", nil, &net.Dialer{Control: func(string, string, syscall.RawConn) error { return errInNetns }}, nil, refused,
			func(err error) bool { return errors.Is(err, errInNetns) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			in := tt.inNetns
			if in == nil {
				in = ns.inNetnsFunc()
			}
			start := time.Now()
			c, err := sockopt.DialInNetns(ctx, in, tt.d, tt.dst)
			if err == nil {
				c.Close()
				t.Fatalf("DialInNetns(%v) succeeded, want an error", tt.dst)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("DialInNetns took %v", el)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" || oe.Addr.String() != tt.dst.String() {
				t.Errorf("error %v (%T) is not a dial *net.OpError for %v", err, err, tt.dst)
			}
			if !tt.check(err) {
				t.Errorf("DialInNetns error = %v (%#v), not the expected kind", err, errors.Unwrap(err))
			}
		})
	}
}

// isTimeout reports whether err is a dial timeout as net.Dialer reports it
// (for a ctx deadline, an error that is context.DeadlineExceeded; for the
// Dialer's Timeout, os.ErrDeadlineExceeded).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && (errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded))
}

// TestDialInNetnsConcurrent dials from many goroutines at once; every
// socket lands in the namespace and afterwards no thread of the process is
// left in it.
func TestDialInNetnsConcurrent(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	ns := newNetns(t)
	want := nstest.PathInode(t, ns.path)
	ln := ns.listen(t, "127.0.0.1:0")
	var srv sync.WaitGroup
	srv.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	defer srv.Wait()
	defer ln.Close()

	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	var wg sync.WaitGroup
	errs := make(chan error, 32*8)
	for range 32 {
		wg.Go(func() {
			for range 8 {
				c, err := sockopt.DialInNetns(t.Context(), ns.inNetnsFunc(), &net.Dialer{}, dst)
				if err != nil {
					errs <- err
					continue
				}
				if got, err := nstest.SocketNetns(c); err != nil || got != want {
					errs <- fmt.Errorf("socket in namespace %d (%v), want %d", got, err, want)
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	nstest.CheckAllThreads(t, nstest.CurrentNetns(t))
}

// here dials with DialInNetns in the test's own namespace.
func here(fn func(leave func() error) error) error { return fn(func() error { return nil }) }

// TestDialTakesAFinishedConnect: with Dial and DialInNetns, a connect that
// is over when connect(2) returns, as every one to a loopback listener is,
// is not left for net.Dialer to wait for in the runtime poller (which it
// would always do); one still under way, whose first SYN is dropped, is
// waited for and connects when the SYN is sent again.
func TestDialTakesAFinishedConnect(t *testing.T) {
	waits, restore := sockopt.CountConnectWaits()
	defer restore()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	for _, dial := range dials {
		for _, src := range []netip.Addr{randomLoopback(), {}} {
			d := sockopt.Dialer(src, sockopt.Options{})
			for range 20 {
				c, err := dial.fn(t.Context(), d, dst)
				if err != nil {
					t.Fatalf("%s from %v: %v", dial.name, src, err)
				}
				s, err := ln.Accept()
				if err != nil {
					t.Fatal(err)
				}
				if got, want := s.RemoteAddr().String(), c.LocalAddr().String(); got != want {
					t.Errorf("server sees %s, the dialed connection is from %s", got, want)
				}
				s.Close()
				c.Close()
			}
		}
	}
	if n := waits(); n != 0 {
		t.Errorf("%d of 80 loopback dials waited in the poller, want none", n)
	}

	nstest.RequireRoot(t, "ip", "iptables")
	a, b := newNetns(t), newNetns(t)
	link(t, a, []string{"10.99.6.1/24"}, b, []string{"10.99.6.2/24"})
	bl := b.listen(t, "10.99.6.2:0")
	defer bl.Close()
	port := fmt.Sprint(bl.Addr().(*net.TCPAddr).Port)
	drop := []string{"INPUT", "-p", "tcp", "--syn", "--dport", port, "-j", "DROP"}
	b.exec(t, append([]string{"iptables", "-A"}, drop...)...)
	// The kernel sends the SYN again after 1 s; the rule is gone by then.
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		time.Sleep(200 * time.Millisecond)
		if out, err := exec.Command("ip", append([]string{"netns", "exec", b.name, "iptables", "-D"}, drop...)...).CombinedOutput(); err != nil {
			t.Errorf("remove the SYN-dropping rule: %v: %s", err, out)
		}
	}()
	defer func() { <-removed }()
	before := waits()
	start := time.Now()
	c, err := sockopt.DialInNetns(t.Context(), a.inNetnsFunc(), &net.Dialer{Timeout: 5 * time.Second}, bl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatalf("dial with the first SYN dropped: %v", err)
	}
	defer c.Close()
	if el := time.Since(start); el < 500*time.Millisecond {
		t.Errorf("dial with the first SYN dropped took %v: the SYN was not dropped", el)
	}
	if n := waits() - before; n != 1 {
		t.Errorf("the dial waited in the poller %d times, want 1", n)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Errorf("write on the connection: %v", err)
	}
}

// TestDialRefusesASelfConnection: a dial whose source port can only be the
// destination's own, on the same address, is connected to itself by the
// kernel (a simultaneous open). Dial (net.Dialer's redial) and DialInNetns
// (its own) close such a connection and try again (which fails with
// EADDRNOTAVAIL while the closed one holds the 4-tuple), and fail rather
// than return one: it would relay a client's bytes back to it.
func TestDialRefusesASelfConnection(t *testing.T) {
	for _, dial := range dials {
		t.Run(dial.name, func(t *testing.T) {
			base := 40000 + rand.IntN(10000)
			selfConnects := 0
			for _, port := range []int{base, base + 1} {
				dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
				d := withControl(sockopt.Dialer(netip.Addr{}, sockopt.Options{}), func(fd int) error {
					return unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, port|port<<16)
				})
				sockets := 0 // more than one: the first connected to itself
				d = withControl(d, func(int) error { sockets++; return nil })
				c, err := dial.fn(t.Context(), d, dst)
				if err == nil {
					c.Close()
					t.Fatalf("port %d: connected %v to %v, want an error", port, c.LocalAddr(), c.RemoteAddr())
				}
				var oe *net.OpError
				if !errors.As(err, &oe) || oe.Op != "dial" || oe.Addr.String() != dst.String() {
					t.Errorf("port %d: error %v (%T) is not a dial *net.OpError for %v", port, err, err, dst)
				}
				if sockets > 1 {
					selfConnects++
				}
				t.Logf("port %d: %d sockets, %v", port, sockets, err)
			}
			if selfConnects == 0 {
				t.Errorf("no dial connected to itself first: the test set nothing up")
			}
		})
	}
}

// TestDialInNetnsAtTheDescriptorLimit: a shared-mode dial takes one
// descriptor, as net.Dialer's does, so with one left it connects (a socket
// made elsewhere and duplicated into a net.Conn would need two, and fail
// there with EMFILE while the accept loops take the last descriptor
// instead of shedding). The namespace's descriptors are open beforehand,
// as netns.Handle holds them.
func TestDialInNetnsAtTheDescriptorLimit(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	t.Run("here", func(t *testing.T) {
		c, s := dialAtTheLimit(t, ln, func() (*net.TCPConn, error) {
			return sockopt.DialInNetns(t.Context(), here, sockopt.Dialer(netip.Addr{}, sockopt.Options{}), dst)
		})
		defer c.Close()
		defer s.Close()
		checkEcho(t, c, s, "one descriptor")
	})
	t.Run("netns", func(t *testing.T) {
		nstest.RequireRoot(t, "ip")
		ns := newNetns(t)
		ns.exec(t, "ip", "link", "set", "lo", "up")
		enter := ns.enterFunc(t) // its descriptors opened now, as netns.Handle holds them
		nln := ns.listen(t, "127.0.0.1:0")
		defer nln.Close()
		c, s := dialAtTheLimit(t, nln, func() (*net.TCPConn, error) {
			return sockopt.DialInNetns(t.Context(), enter, &net.Dialer{}, nln.Addr().(*net.TCPAddr).AddrPort())
		})
		defer c.Close()
		defer s.Close()
		checkEcho(t, c, s, "one descriptor, in a netns")
	})
}

// dialAtTheLimit dials with one descriptor free, which must be enough, and
// returns the connection and its accepted end from ln. A try whose dial
// leaves a descriptor free proves nothing (something else in the test
// process freed one meanwhile: a connection closed by a goroutine still
// reading it, an unreferenced *os.File collected), so it is made again, at
// most five times.
func dialAtTheLimit(t *testing.T, ln net.Listener, dial func() (*net.TCPConn, error)) (*net.TCPConn, net.Conn) {
	t.Helper()
	for try := 1; ; try++ {
		restore := proctest.LeaveDescriptors(t, 1)
		c, err := dial()
		tight := proctest.NoneLeft()
		restore()
		if err != nil {
			t.Fatalf("dial with one descriptor free: %v", err)
		}
		s, err := ln.Accept()
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		if tight {
			return c, s
		}
		c.Close()
		s.Close()
		if try == 5 {
			t.Fatal("a descriptor was still free after the dial, in 5 tries: the limit was not reached")
		}
		t.Logf("try %d: a descriptor was still free after the dial; again", try)
	}
}
