package sockopt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gozt/gozt/proxy/netns"
	"golang.org/x/sys/unix"
)

// DialInNetns connects to addr as Dial does, with the socket made inside
// another network namespace: inNetns runs its function there (a
// netns.Handle's Enter, on the calling goroutine, or in tests
// nstest.InNetnsPath). net.Dialer makes the socket on that thread, and
// d.Control, the bind of d.LocalAddr and the non-blocking connect(2) run
// there too; then the thread goes home (leave), and the rest of the dial,
// with any wait for the handshake, runs outside: a socket belongs to the
// namespace it was made in for its whole life, whatever thread uses it.
//
// Waiting on the locked thread instead would hand its processor to another
// thread and back at each wait (8–25 µs of CPU on a 2-core machine, most of
// what a shared-mode connection once cost over a dedicated-mode one in gozt
// bench's shared scenario), and would hold a thread for each connect under
// way. Making the socket apart from net.Dialer and wrapping it with
// net.FileConn, as gozt once did, takes a second descriptor for the
// duplicate: at the descriptor limit the dial then fails with one still
// free (TestDialInNetnsAtTheDescriptorLimit).
//
// Everything else is as in Dial: d's timeouts, keep-alive and errors, and
// a connection to itself is closed and dialed again from the namespace
// (net.Dialer's own redial would make its socket outside, so it is
// refused).
func DialInNetns(ctx context.Context, inNetns netns.Func, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	if err := ctx.Err(); err != nil { // as net.Dialer fails it, without entering the namespace
		return nil, dialError(d, addr, err)
	}
	for try := 1; ; try++ {
		var c *net.TCPConn
		ds := newDialState(d, addr)
		err := inNetns(func(leave func() error) (err error) {
			ds.leave = leave
			c, err = ds.dial(ctx)
			return err
		})
		switch {
		case err == nil:
			return c, nil
		case !errors.Is(err, errRedialOutside):
			var oe *net.OpError
			if !errors.As(err, &oe) {
				err = dialError(d, addr, err)
			}
			return nil, err
		case try < selfConnectTries:
			continue
		case ds.connErr != nil: // net.Dialer's redial after a spurious EADDRNOTAVAIL
			return nil, dialError(d, addr, ds.connErr)
		default:
			return nil, dialError(d, addr, errSelfConnect)
		}
	}
}

// dialError is err as the *net.OpError net.Dialer returns.
func dialError(d *net.Dialer, addr netip.AddrPort, err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Source: d.LocalAddr, Addr: net.TCPAddrFromAddrPort(addr), Err: err}
}

// errRedialOutside refuses a socket net.Dialer makes to dial again after a
// self-connect or a spurious EADDRNOTAVAIL: DialInNetns's thread has left
// the namespace by then, so it dials again from inside.
var errRedialOutside = errors.New("sockopt: redial outside the namespace")

// A socket that connects without a bound port to a port of its own
// address can be given that same port as its source, and is then
// connected to itself (a simultaneous open), whether or not something
// listens there. As net.Dialer does, such a connection is closed and the
// dial tried again (the closed one's 4-tuple is then taken for a while, so
// the retry usually fails with EADDRNOTAVAIL); unlike net.Dialer, which
// returns the connection of a third self-connect, the dial then fails. A
// proxy would otherwise relay a client's bytes back to it.
const selfConnectTries = 3

var errSelfConnect = errors.New("connect: the socket connected to itself")

// selfConnected reports whether c's two ends are the same address.
func selfConnected(c *net.TCPConn) bool {
	la, lok := c.LocalAddr().(*net.TCPAddr)
	ra, rok := c.RemoteAddr().(*net.TCPAddr)
	return lok && rok && la.Port == ra.Port && la.IP.Equal(ra.IP)
}

// dial is Dial on Linux: d's own dial, with a Control that binds the
// source and connects, then asks the socket whether the handshake is over;
// net.Dialer's connect then finds the socket connected (EISCONN) and does
// not wait. A connect still under way is left to net.Dialer, which waits
// for it as always (EALREADY): parking the goroutine there costs a wake-up
// of the poller's thread, about 1.4× the latency and CPU of a loopback dial
// (BenchmarkDialLoopback), and a connect to a loopback or local address, or
// to a veth peer such as a pod on this node, has usually finished by the
// time connect(2) returns (the whole handshake runs in the softirqs of the
// connecting system call).
//
// The socket stays net.Dialer's own, so a dial takes one descriptor (see
// DialInNetns for what a second one costs at the limit), and net.Dialer's
// timeout, cancellation, keep-alive and redial of a socket connected to
// itself apply. Without d.LocalAddr the bind is left out and the kernel
// picks the source at connect; the address goes through DialContext's
// resolver, which for an address literal only parses it.
func dial(ctx context.Context, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	return newDialState(d, addr).dial(ctx)
}

// dialState is one dial's: a copy of the caller's Dialer whose Control
// runs the caller's, binds and connects, and what that Control needs, in
// one allocation besides the two method values (the Control, and the
// function it hands the socket to) made once per dial.
type dialState struct {
	d        net.Dialer
	orig     *net.Dialer
	inner    func(network, address string, rc syscall.RawConn) error
	src, dst netip.AddrPort
	network  string // the socket's, while Control runs
	err      error  // connectFD's
	connect  func(fd uintptr)

	// For DialInNetns: leave moves the thread home once the first socket
	// has started its connect, whose error connErr keeps; net.Dialer's
	// later sockets (its redial) would be made outside the namespace and
	// are refused.
	leave   func() error
	made    int
	connErr error
}

func newDialState(d *net.Dialer, addr netip.AddrPort) *dialState {
	ds := &dialState{d: *d, orig: d, inner: d.Control, dst: addr}
	if la, ok := d.LocalAddr.(*net.TCPAddr); ok && la != nil {
		ds.src = la.AddrPort()
	}
	ds.d.LocalAddr = nil // bound in Control, before the connect
	ds.d.Control = ds.control
	ds.connect = ds.connectFD
	return ds
}

// dial is d's DialContext with the Control of dialState.
func (ds *dialState) dial(ctx context.Context) (*net.TCPConn, error) {
	c, err := ds.d.DialContext(ctx, "tcp", ds.dst.String())
	if err != nil {
		if oe, ok := err.(*net.OpError); ok && oe.Source == nil {
			oe.Source = ds.orig.LocalAddr // as net.Dialer names it
		}
		return nil, err
	}
	tc := c.(*net.TCPConn)
	if selfConnected(tc) { // net.Dialer's third try
		tc.Close()
		return nil, dialError(ds.orig, ds.dst, errSelfConnect)
	}
	return tc, nil
}

// control is the Dialer's Control: the caller's, then the bind and the
// connect, then (in DialInNetns) the way home.
func (ds *dialState) control(network, address string, rc syscall.RawConn) error {
	ds.made++
	if ds.leave != nil && ds.made > 1 {
		return errRedialOutside
	}
	err := ds.bindConnect(network, address, rc)
	if ds.leave != nil {
		ds.connErr = err
		if lerr := ds.leave(); lerr != nil {
			return lerr
		}
	}
	return err
}

func (ds *dialState) bindConnect(network, address string, rc syscall.RawConn) error {
	if ds.inner != nil {
		if err := ds.inner(network, address, rc); err != nil {
			return err
		}
	}
	ds.network, ds.err = network, nil
	if err := rc.Control(ds.connect); err != nil {
		return fmt.Errorf("sockopt: %w", err)
	}
	return ds.err
}

func (ds *dialState) connectFD(fd uintptr) {
	ds.err = connectNow(int(fd), ds.network, ds.src, ds.dst)
}

// connectNow binds fd, a socket for network ("tcp4" or "tcp6"), to src if
// valid, starts connecting it to dst and asks whether the handshake is
// over (a non-blocking connect(2) says EINPROGRESS even when the handshake
// ran inside it, as on loopback). It returns nil once the connect is over
// or under way (net's connect takes it from there), and the connect's
// error if it failed already.
func connectNow(fd int, network string, src, dst netip.AddrPort) error {
	family := unix.AF_INET
	if network == "tcp6" {
		family = unix.AF_INET6
	}
	var ssa unix.Sockaddr
	if src.IsValid() {
		var err error
		if ssa, err = sockaddr(src, family); err != nil {
			return err
		}
	}
	dsa, err := sockaddr(dst, family)
	if err != nil {
		return err
	}
	if err := bindConnect(fd, ssa, dsa); err != nil {
		return err
	}
	done, err := connected(fd)
	if !done {
		if hook := testHookWaitConnect.Load(); hook != nil {
			(*hook)()
		}
	}
	return err
}

// testHookWaitConnect, if set, is called when connectNow leaves a connect
// under way for net.Dialer to wait for in the runtime poller.
var testHookWaitConnect atomic.Pointer[func()]

// bindConnect binds fd to src, if not nil, and starts connecting it to dst.
// It returns nil once the connect is over or under way (a non-blocking
// socket's EINPROGRESS), and the error of a bind or connect that failed at
// once.
func bindConnect(fd int, src, dst unix.Sockaddr) error {
	if src != nil {
		if err := unix.Bind(fd, src); err != nil {
			return os.NewSyscallError("bind", err)
		}
	}
	switch err := unix.Connect(fd, dst); err {
	case nil, unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		return nil
	default:
		return os.NewSyscallError("connect", err)
	}
}

// sockaddr converts ap for a socket of family; an invalid address is the
// family's unspecified one.
func sockaddr(ap netip.AddrPort, family int) (unix.Sockaddr, error) {
	a := ap.Addr().Unmap()
	if family == unix.AF_INET {
		if a.IsValid() && !a.Is4() {
			return nil, fmt.Errorf("IPv6 address %v in an IPv4 dial", a)
		}
		sa := &unix.SockaddrInet4{Port: int(ap.Port())}
		if a.IsValid() {
			sa.Addr = a.As4()
		}
		return sa, nil
	}
	sa := &unix.SockaddrInet6{Port: int(ap.Port())}
	if a.IsValid() {
		sa.Addr = a.As16()
	}
	if z := a.Zone(); z != "" {
		ifi, err := net.InterfaceByName(z)
		if err != nil {
			return nil, err
		}
		sa.ZoneId = uint32(ifi.Index)
	}
	return sa, nil
}

// connected reports whether the connect on fd has finished, and with what
// error. It asks for the socket's TCP state, the first byte of TCP_INFO
// (one system call into a buffer on the stack): SYN_SENT, or SYN_RECV in a
// simultaneous open, is a connect under way; CLOSE is one that failed, with
// the error SO_ERROR then gives; any other state is a connection (a peer
// that has already closed its side leaves it in CLOSE_WAIT).
func connected(fd int) (bool, error) {
	var state [1]byte
	n := uint32(len(state))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&state[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return true, os.NewSyscallError("getsockopt", errno)
	}
	switch state[0] {
	case unix.BPF_TCP_SYN_SENT, unix.BPF_TCP_SYN_RECV:
		return false, nil
	case unix.BPF_TCP_CLOSE:
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return true, os.NewSyscallError("getsockopt", err)
		}
		if v == 0 {
			return false, nil // not connecting at all: net's connect says why
		}
		return true, os.NewSyscallError("connect", syscall.Errno(v))
	default:
		return true, nil
	}
}
