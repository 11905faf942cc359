package sockopt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DialInNetns connects to addr as d.DialContext(ctx, "tcp", addr.String())
// would, with the socket made inside another network namespace: inNetns
// runs its function there and returns its error (InNetnsFD, or
// inpod.Netns.Run). Only what cannot block runs inside — socket(2),
// d.Control, the bind of d.LocalAddr and the non-blocking connect(2) — and
// the wait for the handshake runs on the calling goroutine, outside any
// namespace: a socket belongs to the namespace it was made in for its whole
// life, whatever thread uses it.
//
// Running all of d.DialContext inside inNetns instead keeps a goroutine
// locked to its thread while the connect waits, and each wait of a locked
// goroutine hands its processor to another thread and back (8–25 µs of CPU
// on a 2-core machine); gozt bench's shared scenario measured that as most
// of what a shared-mode connection cost over a dedicated-mode one.
//
// d.Timeout, d.Deadline and ctx bound the connect, and d.KeepAlive and
// d.KeepAliveConfig apply to the connection, as in net.Dialer; TCP_NODELAY
// is set as net sets it. d.ControlContext, d.Resolver, d.FallbackDelay and
// multipath TCP do not apply: an address needs no resolving, and nothing
// falls back. Errors are *net.OpError values as net.Dialer returns, wrapping
// the system call's errno.
func DialInNetns(ctx context.Context, inNetns func(fn func() error) error, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	ctx, cancel := dialContext(ctx, d)
	defer cancel()
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Source: d.LocalAddr, Addr: net.TCPAddrFromAddrPort(addr), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr(mapCtxErr(err))
	}
	fd := -1
	err := inNetns(func() (err error) {
		fd, err = startConnect(d, addr)
		return err
	})
	if err != nil {
		if fd >= 0 { // inNetns failed after fn succeeded
			unix.Close(fd)
		}
		return nil, opErr(err)
	}
	c, err := finishConnect(ctx, fd)
	if err != nil {
		return nil, opErr(err)
	}
	if err := setKeepAlive(c, d); err != nil {
		c.Close()
		return nil, opErr(err)
	}
	return c, nil
}

// dialContext returns ctx bounded by d's Timeout and Deadline, as
// net.Dialer bounds a dial.
func dialContext(ctx context.Context, d *net.Dialer) (context.Context, context.CancelFunc) {
	deadline := d.Deadline
	if d.Timeout > 0 {
		if t := time.Now().Add(d.Timeout); deadline.IsZero() || t.Before(deadline) {
			deadline = t
		}
	}
	if deadline.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline)
}

// startConnect makes a non-blocking TCP socket for addr in the calling
// thread's network namespace, runs d.Control on it, binds d.LocalAddr and
// starts connecting. It returns the socket, or -1 and an error with the
// socket closed.
func startConnect(d *net.Dialer, addr netip.AddrPort) (fd int, err error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	family, network := unix.AF_INET, "tcp4"
	if addr.Addr().Is6() {
		family, network = unix.AF_INET6, "tcp6"
	}
	dst, err := sockaddr(addr, family)
	if err != nil {
		return -1, err
	}
	var src unix.Sockaddr
	if d.LocalAddr != nil {
		la, ok := d.LocalAddr.(*net.TCPAddr)
		if !ok {
			return -1, fmt.Errorf("local address %v is not TCP", d.LocalAddr)
		}
		if src, err = sockaddr(la.AddrPort(), family); err != nil {
			return -1, err
		}
	}
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	if d.Control != nil {
		if err := d.Control(network, addr.String(), fdConn(fd)); err != nil {
			return -1, err
		}
	}
	if src != nil {
		if err := unix.Bind(fd, src); err != nil {
			return -1, os.NewSyscallError("bind", err)
		}
	}
	switch err := unix.Connect(fd, dst); err {
	case nil, unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		return fd, nil
	default:
		return -1, os.NewSyscallError("connect", err)
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

// finishConnect waits until the connect that startConnect began on fd is
// done, and returns the connection. fd is closed either way; the
// connection holds a duplicate of it.
func finishConnect(ctx context.Context, fd int) (*net.TCPConn, error) {
	f := os.NewFile(uintptr(fd), "tcp") // non-blocking, so the runtime poller does the waiting
	defer f.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = f.SetWriteDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var connErr error
	// Write calls the function before it first waits: a connect on
	// loopback or to a veth peer has usually finished already, and then
	// nothing waits at all.
	err = rc.Write(func(fd uintptr) bool {
		var done bool
		done, connErr = connected(int(fd))
		return done
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, mapCtxErr(ctx.Err())
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, errDialTimeout{} // the deadline's timer fired before ctx's
		}
		return nil, err
	}
	if connErr != nil {
		return nil, connErr
	}
	return fileConn(f)
}

// fileConn returns a connection on a duplicate of f's connected socket.
func fileConn(f *os.File) (*net.TCPConn, error) {
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
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

// mapCtxErr turns a context error into the one net.Dialer returns for it.
func mapCtxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errDialTimeout{}
	}
	return err
}

// errDialTimeout is the error of a connect that ran out of time. Like
// net's, it reports Timeout and matches context.DeadlineExceeded, and
// os.ErrDeadlineExceeded as well.
type errDialTimeout struct{}

func (errDialTimeout) Error() string   { return "i/o timeout" }
func (errDialTimeout) Timeout() bool   { return true }
func (errDialTimeout) Temporary() bool { return true }
func (errDialTimeout) Is(err error) bool {
	return err == context.DeadlineExceeded || err == os.ErrDeadlineExceeded
}

// setKeepAlive applies d's keep-alive settings to c as net.Dialer does.
func setKeepAlive(c *net.TCPConn, d *net.Dialer) error {
	cfg := d.KeepAliveConfig
	if !cfg.Enable && d.KeepAlive >= 0 {
		cfg = net.KeepAliveConfig{Enable: true, Idle: d.KeepAlive}
	}
	if !cfg.Enable {
		return c.SetKeepAlive(false)
	}
	return c.SetKeepAliveConfig(cfg)
}

// fdConn is the syscall.RawConn handed to Control functions for a socket
// that the runtime poller does not know yet; they only call Control.
type fdConn int

var _ syscall.RawConn = fdConn(0)

func (c fdConn) Control(f func(fd uintptr)) error { f(uintptr(c)); return nil }
func (fdConn) Read(func(fd uintptr) bool) error   { return errors.ErrUnsupported }
func (fdConn) Write(func(fd uintptr) bool) error  { return errors.ErrUnsupported }
