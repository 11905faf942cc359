//go:build !linux

package sockopt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/gozt/gozt/proxy/netns"
)

// errUnsupported is returned for everything this package cannot do outside
// Linux.
var errUnsupported = fmt.Errorf("sockopt: %w: not supported on this OS", errors.ErrUnsupported)

// OriginalDst is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func OriginalDst(c *net.TCPConn) (dst netip.AddrPort, ok bool, err error) {
	return netip.AddrPort{}, false, errUnsupported
}

type controlFunc = func(network, address string, c syscall.RawConn) error

// listenControl fails for every option but a best-effort Transparent.
func listenControl(o Options) controlFunc {
	return func(string, string, syscall.RawConn) error {
		if o.RequireTransparent || o.Freebind || o.ReusePort || o.Mark != 0 || o.UserTimeout > 0 {
			return errUnsupported
		}
		return nil
	}
}

// dialControl fails for a non-local source and for the options listenControl
// rejects.
func dialControl(src netip.Addr, o Options) controlFunc {
	lc := listenControl(o)
	return func(network, address string, c syscall.RawConn) error {
		if src.IsValid() && !IsLocal(src) {
			return errUnsupported
		}
		return lc(network, address, c)
	}
}

// TransparentEnabled reports false: IP_TRANSPARENT is Linux-only.
func TransparentEnabled(l net.Listener) bool { return false }

// IsLocal reports whether ip is assigned to an interface, or is a loopback
// address.
func IsLocal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == ip.WithZone("") {
				return true
			}
		}
	}
	return false
}

// DialInNetns is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling inNetns.
func DialInNetns(ctx context.Context, inNetns netns.Func, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	return nil, errUnsupported
}

// dial is Dial: d.DialTCP when d has a source address, which skips the
// resolver (DialContext formats addr, parses it back and builds an address
// list); otherwise DialContext, because DialTCP binds a zero local address
// explicitly to 0.0.0.0:0, a bind that picks a port where DialContext
// leaves it to connect (see Dialer).
func dial(ctx context.Context, d *net.Dialer, addr netip.AddrPort) (*net.TCPConn, error) {
	la, ok := d.LocalAddr.(*net.TCPAddr)
	if !ok || la == nil {
		c, err := d.DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return nil, err
		}
		return c.(*net.TCPConn), nil
	}
	return d.DialTCP(ctx, "tcp", la.AddrPort(), addr)
}
