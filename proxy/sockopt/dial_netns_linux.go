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

	"golang.org/x/sys/unix"
)

// DialInNetns connects to addr as Dial does, with the socket made inside
// another network namespace: inNetns runs its function there (InNetnsPath,
// or inpod.Netns.Enter, which runs it on the calling goroutine,
// EnterNetnsFDHome). net.Dialer makes the socket on that thread, and
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
func DialInNetns(ctx context.Context, inNetns InNetnsFunc, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	if ctx.Err() != nil {
		// net.Dialer fails a done ctx before it makes a socket, so the
		// namespace is not entered; a socket made anyway would be made
		// outside, and is refused.
		return dialAround(ctx, d, addr, func(func() error) error { return errRedialOutside })
	}
	var connErr error // the namespace socket's connect, when net.Dialer redialed after it
	for try := 1; ; try++ {
		var c *net.TCPConn
		err := inNetns(func(leave func() error) (err error) {
			made := 0
			c, err = dialAround(ctx, d, addr, func(connect func() error) error {
				if made++; made > 1 {
					return errRedialOutside
				}
				connErr = connect()
				if err := leave(); err != nil {
					return err
				}
				return connErr
			})
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
		case connErr != nil:
			return nil, dialError(d, addr, connErr)
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
// The socket stays net.Dialer's own, so a dial takes one descriptor, and
// net.Dialer's timeout, cancellation, keep-alive and redial of a socket
// connected to itself apply. (Wrapping a socket made here with
// net.FileConn costs a second descriptor while it duplicates the first:
// at the descriptor limit, dials then fail with one descriptor still free,
// which the accept loops take instead of shedding, and TestFDExhaustion's
// refusals and readiness fail.) Without d.LocalAddr the bind is left out
// and the kernel picks the source at connect; the address goes through
// DialContext's resolver, which for an address literal only parses it.
func dial(ctx context.Context, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	return dialAround(ctx, d, addr, nil)
}

// dialAround is dial with around, if not nil, called in the Control of
// each socket net.Dialer makes, around the step that runs d.Control, binds
// and starts the connect: around calls connect, or not, and returns the
// Control's error.
func dialAround(ctx context.Context, d *net.Dialer, addr netip.AddrPort, around func(connect func() error) error) (*net.TCPConn, error) {
	var src netip.AddrPort
	if la, ok := d.LocalAddr.(*net.TCPAddr); ok && la != nil {
		src = la.AddrPort()
	}
	cd := *d
	cd.LocalAddr = nil // bound in Control, before the connect
	inner := d.Control
	cd.Control = func(network, address string, rc syscall.RawConn) error {
		connect := func() error {
			if inner != nil {
				if err := inner(network, address, rc); err != nil {
					return err
				}
			}
			return control(rc, func(fd int) error { return connectNow(fd, network, src, addr) })
		}
		if around != nil {
			return around(connect)
		}
		return connect()
	}
	c, err := cd.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		if oe, ok := err.(*net.OpError); ok && oe.Source == nil {
			oe.Source = d.LocalAddr // as net.Dialer names it
		}
		return nil, err
	}
	tc := c.(*net.TCPConn)
	if selfConnected(tc) { // net.Dialer's third try
		tc.Close()
		return nil, dialError(d, addr, errSelfConnect)
	}
	return tc, nil
}

// connectNow binds fd, a socket for network ("tcp4" or "tcp6"), to src if
// valid, starts connecting it to dst and asks whether the handshake is
// over. It returns nil once the connect is over or under way (net's connect
// takes it from there), and the connect's error if it failed already.
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
// error.
func connected(fd int) (bool, error) {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return true, os.NewSyscallError("getsockopt", err)
	}
	switch e := syscall.Errno(v); e {
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		return false, nil
	case 0:
		// SO_ERROR is 0 while the handshake is under way too: only a peer
		// name proves it done, as net's own connect checks.
		_, err := unix.Getpeername(fd)
		return err == nil, nil
	default:
		return true, os.NewSyscallError("connect", e)
	}
}
