// Package sockopt sets the socket options a ztunnel-compatible proxy needs
// and reads the ones the kernel sets for it: the original destination of a
// redirected connection (SO_ORIGINAL_DST), transparent and freebind sockets
// that accept for and connect from addresses the host does not own
// (IP_TRANSPARENT, IP_FREEBIND), SO_REUSEPORT for upgrade hand-off and
// SO_MARK so the redirection rules skip the proxy's own packets (SPEC §1.3,
// §2.5, §3.1), and TCP keep-alive and TCP_USER_TIMEOUT (SPEC §0.3). DialInNetns dials from inside another network namespace
// (package netns enters it) without waiting there.
//
// Everything here is Linux-only; on other systems the functions return an
// error wrapping errors.ErrUnsupported (sockopt_other.go) so the package
// still builds for development on a laptop.
package sockopt

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// Options are socket options for ListenConfig and Dialer. The zero value
// sets nothing.
type Options struct {
	// Transparent sets IP_TRANSPARENT (IPV6_TRANSPARENT on IPv6 sockets):
	// a listener accepts connections for addresses it does not own, and a
	// socket may use a non-local source address. It needs CAP_NET_ADMIN
	// (or CAP_NET_RAW), so it is best effort unless RequireTransparent is
	// set; check the outcome on a listener with TransparentEnabled.
	Transparent bool

	// RequireTransparent makes failing to set Transparent an error instead
	// of a silent no-op.
	RequireTransparent bool

	// Freebind sets IP_FREEBIND (IPV6_FREEBIND): the socket may bind an
	// address that is not (yet) assigned to an interface.
	Freebind bool

	// ReusePort sets SO_REUSEPORT, so several listeners (an old and a new
	// proxy during an upgrade, SPEC §1.3) share one port.
	ReusePort bool

	// Mark sets SO_MARK on the socket's packets (needs CAP_NET_ADMIN).
	// If zero, no mark is set.
	Mark uint32

	// KeepAlive configures TCP keep-alive on the socket (accepted sockets,
	// for a listener). Its zero value turns keep-alive off; with Enable,
	// zero durations and count take Go's defaults.
	KeepAlive net.KeepAliveConfig

	// UserTimeout, if positive, sets TCP_USER_TIMEOUT (whole milliseconds,
	// rounded up): how long sent data may stay unacknowledged, and
	// keep-alive probes unanswered, before the kernel drops the connection
	// (ztunnel's USER_TIMEOUT_ENABLED). Set on a listener, it is inherited
	// by the sockets the listener accepts.
	UserTimeout time.Duration
}

// dialTimeout bounds a Dialer's connect (SPEC §2.1: ztunnel's 10 s).
const dialTimeout = 10 * time.Second

// ListenConfig returns a net.ListenConfig whose Control sets the options o
// on each listening socket before it binds. Its TCP listeners are plain TCP,
// as ztunnel's are: since Go 1.24 net makes Multipath TCP listeners by
// default where the kernel allows it, whose sockets support a kernel-
// dependent subset of the options above (IP_TRANSPARENT, keep-alive) and
// cost more system calls to make.
func ListenConfig(o Options) net.ListenConfig {
	lc := net.ListenConfig{KeepAlive: -1}
	lc.SetMultipathTCP(false)
	if o.KeepAlive.Enable {
		lc.KeepAliveConfig = o.KeepAlive
	}
	if o.any() {
		lc.Control = listenControl(o)
	}
	return lc
}

// Dialer returns a net.Dialer for upstream connections that takes src as
// the source address (SPEC §2.5):
//
//   - src is not valid: no bind; the kernel picks the source.
//   - src is valid: bind to src with IP_BIND_ADDRESS_NO_PORT, so that
//     connect, not bind, picks the source port (a bind to port 0 searches
//     the port range under a lock and slows down as sockets pile up on one
//     address; connect needs only a free 4-tuple), and with IP_TRANSPARENT
//     and IP_FREEBIND (IPv6 variants for IPv6), which spoofs a source the
//     host does not own. Those two need CAP_NET_ADMIN; replies reach the
//     socket only if policy routing sends them to the local stack
//     (istio-cni's table 100, SPEC §1.3).
//   - Without that capability a local src (IsLocal) is bound plainly; for
//     a non-local one dialing fails, before anything is sent, with the
//     error from this package setting IP_TRANSPARENT (EPERM); the caller
//     may then dial without src.
//
// Whether src is local is decided in the namespace where the socket is made,
// when it is made, so a Dialer may be built once and used inside InNetns.
// An IPv4-mapped IPv6 src is used as IPv4. The options in o are set on every
// socket; the connect timeout is 10 s; TCP_NODELAY stays on (Go's default).
func Dialer(src netip.Addr, o Options) *net.Dialer {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: -1}
	if o.KeepAlive.Enable {
		d.KeepAliveConfig = o.KeepAlive
	}
	src = src.Unmap()
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice(), Zone: src.Zone()}
	}
	if src.IsValid() || o.any() {
		d.Control = dialControl(src, o)
	}
	return d
}

// Dial connects to addr with d as d.DialContext(ctx, "tcp", addr.String())
// does. On Linux d's Control is followed by a bind and the connect, and the
// socket is asked whether the handshake is over, so that a connect that
// finished inside connect(2), as one to a loopback, local or veth-peer
// address usually does, is not waited for in the runtime poller, which
// net.Dialer always does (dial in dial_netns_linux.go). Elsewhere it is d's
// own dial, without the resolver when d has a source address.
func Dial(ctx context.Context, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	return dial(ctx, d, addr)
}

// any reports whether o asks for any option to be set by a Control function.
func (o Options) any() bool {
	return o.Transparent || o.RequireTransparent || o.Freebind || o.ReusePort || o.Mark != 0 || o.UserTimeout > 0
}
