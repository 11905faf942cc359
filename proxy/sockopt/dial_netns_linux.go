package sockopt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
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
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Source: d.LocalAddr, Addr: net.TCPAddrFromAddrPort(addr), Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr(mapCtxErr(err))
	}
	if !d.Deadline.IsZero() && !time.Now().Before(d.Deadline) {
		return nil, opErr(errDialTimeout{})
	}
	for try := 1; ; try++ {
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
		c, err := finishConnect(ctx, d, fd)
		if err != nil {
			return nil, opErr(err)
		}
		if selfConnected(c) {
			c.Close()
			if try < selfConnectTries {
				continue
			}
			return nil, opErr(errSelfConnect)
		}
		if err := setKeepAlive(c, d); err != nil {
			c.Close()
			return nil, opErr(err)
		}
		return c, nil
	}
}

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
// for it as always (EALREADY).
//
// The socket stays net.Dialer's own, so a dial takes one descriptor, as
// before, and net.Dialer's timeout, cancellation and redial of a socket
// connected to itself apply. (Wrapping a socket made here with
// net.FileConn, as DialInNetns must, costs a second descriptor while it
// duplicates the first: at the descriptor limit, dials then fail with one
// descriptor still free, which the accept loops take instead of shedding,
// and TestFDExhaustion's refusals and readiness fail.) Without d.LocalAddr
// the bind is left out and the kernel picks the source at connect; the
// address goes through DialContext's resolver, which for an address
// literal only parses it.
func dial(ctx context.Context, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	var src netip.AddrPort
	if la, ok := d.LocalAddr.(*net.TCPAddr); ok && la != nil {
		src = la.AddrPort()
	}
	cd := *d
	cd.LocalAddr = nil // bound in Control, before the connect
	inner := d.Control
	cd.Control = func(network, address string, rc syscall.RawConn) error {
		if inner != nil {
			if err := inner(network, address, rc); err != nil {
				return err
			}
		}
		return control(rc, func(fd int) error { return connectNow(fd, network, src, addr) })
	}
	c, err := cd.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		if oe, ok := err.(*net.OpError); ok && oe.Source == nil {
			oe.Source = d.LocalAddr // as net.Dialer names it
		}
		return nil, err
	}
	return c.(*net.TCPConn), nil
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
	_, err = connected(fd)
	return err
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
	if err := bindConnect(fd, src, dst); err != nil {
		return -1, err
	}
	return fd, nil
}

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

// finishConnect waits until the connect that startConnect began on fd is
// done, within ctx and d's Timeout and Deadline, and returns the
// connection. fd is closed either way; the connection holds a duplicate of
// it.
//
// A connect to a loopback or local address, or to a veth peer such as a
// pod on this node, has usually finished by the time connect(2) returns
// (the whole handshake runs in the softirqs of the connecting system call),
// so the socket is asked first, and a connected one is taken as it is,
// without the runtime poller. Waiting there instead, as net.Dialer always
// does after EINPROGRESS, parks the goroutine and costs a wake-up of the
// poller's thread: about 1.4× the latency and CPU of a loopback dial
// (BenchmarkDialLoopback, which measures Dial's way of skipping the wait).
func finishConnect(ctx context.Context, d *net.Dialer, fd int) (*net.TCPConn, error) {
	done, err := connected(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if done {
		return connectedConn(fd)
	}
	if hook := testHookWaitConnect.Load(); hook != nil {
		(*hook)()
	}
	// Only a connect that waits needs the bounded context (and its timer).
	ctx, cancel := dialContext(ctx, d)
	defer cancel()
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

// testHookWaitConnect, if set, is called when finishConnect waits for a
// connect in the runtime poller.
var testHookWaitConnect atomic.Pointer[func()]

// connectedConn returns a connection on a duplicate of fd, a connected
// socket, and closes fd. fd is made blocking first so that os.NewFile
// leaves it out of the runtime poller (the close would only take it out
// again); the duplicate that net.FileConn makes is non-blocking again, as
// the two share their status flags, and is the one the poller gets.
func connectedConn(fd int) (*net.TCPConn, error) {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil { // O_NONBLOCK is the only status flag set
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(fd), "tcp")
	defer f.Close()
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
//
// c comes from net.FileConn, which has turned keep-alive on with Go's
// defaults, net.KeepAliveConfig's for its zero fields (15 s idle, 15 s
// between probes, 9 probes), so only the fields that differ are set: two
// system calls for ztunnel's settings instead of four. TestDialInNetns and
// TestDialKeepAlive read all four back.
func setKeepAlive(c *net.TCPConn, d *net.Dialer) error {
	cfg := d.KeepAliveConfig
	if !cfg.Enable && d.KeepAlive >= 0 {
		cfg = net.KeepAliveConfig{Enable: true, Idle: d.KeepAlive}
	}
	if !cfg.Enable {
		return c.SetKeepAlive(false)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	set := func(fd uintptr, opt, v int, name string) {
		if serr == nil {
			if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, opt, v); err != nil {
				serr = os.NewSyscallError("setsockopt "+name, err)
			}
		}
	}
	err = rc.Control(func(fd uintptr) {
		if s := keepAliveSeconds(cfg.Idle); s != 0 && s != fileConnKeepAliveSecs {
			set(fd, unix.TCP_KEEPIDLE, s, "TCP_KEEPIDLE")
		}
		if s := keepAliveSeconds(cfg.Interval); s != 0 && s != fileConnKeepAliveSecs {
			set(fd, unix.TCP_KEEPINTVL, s, "TCP_KEEPINTVL")
		}
		if cfg.Count > 0 && cfg.Count != fileConnKeepAliveCount {
			set(fd, unix.TCP_KEEPCNT, cfg.Count, "TCP_KEEPCNT")
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// What net.FileConn sets on a TCP socket: keep-alive on, with
// net.KeepAliveConfig's defaults.
const (
	fileConnKeepAliveSecs  = 15
	fileConnKeepAliveCount = 9
)

// keepAliveSeconds is d in whole seconds, rounded up as net rounds it; 0
// for a zero or negative d (zero: Go's default, which is FileConn's;
// negative: left as it is).
func keepAliveSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int(min((d+time.Second-1)/time.Second, math.MaxInt32))
}

// fdConn is the syscall.RawConn handed to Control functions for a socket
// that the runtime poller does not know yet; they only call Control.
type fdConn int

var _ syscall.RawConn = fdConn(0)

func (c fdConn) Control(f func(fd uintptr)) error { f(uintptr(c)); return nil }
func (fdConn) Read(func(fd uintptr) bool) error   { return errors.ErrUnsupported }
func (fdConn) Write(func(fd uintptr) bool) error  { return errors.ErrUnsupported }
