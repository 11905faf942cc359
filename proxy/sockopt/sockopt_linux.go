package sockopt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// OriginalDst returns the destination a connection had before an iptables
// or nftables REDIRECT/DNAT rule changed it (SPEC §3.1), read with
// SO_ORIGINAL_DST for IPv4 connections (also IPv4-mapped ones on a
// dual-stack socket) and IP6T_SO_ORIGINAL_DST for IPv6.
//
// ok is false, with no error, when the connection was not redirected: the
// kernel has no NAT record for it (no conntrack entry, or conntrack not
// loaded) or the recorded destination is the socket's own local address.
// Callers then use the local address (as ztunnel does for TPROXY).
func OriginalDst(c *net.TCPConn) (dst netip.AddrPort, ok bool, err error) {
	laddr, isTCP := c.LocalAddr().(*net.TCPAddr)
	if !isTCP {
		return netip.AddrPort{}, false, errors.New("sockopt: original dst: connection has no TCP local address")
	}
	local := laddr.AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("sockopt: original dst: %w", err)
	}
	var gerr error
	cerr := rc.Control(func(fd uintptr) {
		if local.Addr().Is4() {
			dst, gerr = originalDst4(int(fd))
		} else {
			dst, gerr = originalDst6(int(fd))
		}
	})
	switch {
	case cerr != nil:
		return netip.AddrPort{}, false, fmt.Errorf("sockopt: original dst: %w", cerr)
	case errors.Is(gerr, unix.ENOENT), errors.Is(gerr, unix.ENOPROTOOPT):
		// ENOENT: conntrack knows no such connection. ENOPROTOOPT:
		// nf_conntrack (which provides the option) is not loaded.
		return netip.AddrPort{}, false, nil
	case gerr != nil:
		return netip.AddrPort{}, false, fmt.Errorf("sockopt: original dst: %w", gerr)
	case dst == local:
		return netip.AddrPort{}, false, nil
	}
	return dst, true, nil
}

// originalDst4 reads SO_ORIGINAL_DST, a struct sockaddr_in. x/sys/unix has
// no getter for that struct; GetsockoptIPv6Mreq reads 20 bytes, which holds
// the 16-byte sockaddr_in, and the kernel accepts any length that fits it
// (net/netfilter/nf_conntrack_proto.c, getorigdst).
func originalDst4(fd int) (netip.AddrPort, error) {
	m, err := unix.GetsockoptIPv6Mreq(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, err
	}
	b := m.Multiaddr[:]
	if family := binary.NativeEndian.Uint16(b[0:2]); family != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST returned address family %d", family)
	}
	addr := netip.AddrFrom4([4]byte(b[4:8]))
	return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(b[2:4])), nil
}

// originalDst6 reads IP6T_SO_ORIGINAL_DST (the same number, 80, at
// SOL_IPV6), a struct sockaddr_in6; GetsockoptIPv6MTUInfo reads a
// sockaddr_in6 followed by a uint32, which the kernel accepts
// (ipv6_getorigdst checks only that the length holds a sockaddr_in6).
func originalDst6(fd int) (netip.AddrPort, error) {
	m, err := unix.GetsockoptIPv6MTUInfo(fd, unix.SOL_IPV6, unix.SO_ORIGINAL_DST)
	if err != nil {
		return netip.AddrPort{}, err
	}
	sa := m.Addr
	if sa.Family != unix.AF_INET6 {
		return netip.AddrPort{}, fmt.Errorf("IP6T_SO_ORIGINAL_DST returned address family %d", sa.Family)
	}
	// The port is in network byte order in memory.
	var port [2]byte
	binary.NativeEndian.PutUint16(port[:], sa.Port)
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), binary.BigEndian.Uint16(port[:])), nil
}

// controlFunc is the type of net.ListenConfig.Control and net.Dialer.Control.
type controlFunc = func(network, address string, c syscall.RawConn) error

func listenControl(o Options) controlFunc {
	return func(_, _ string, rc syscall.RawConn) error {
		return setOptions(rc, o, false)
	}
}

func dialControl(src netip.Addr, o Options) controlFunc {
	return func(_, _ string, rc syscall.RawConn) error {
		// Control runs on the thread that made the socket, so IsLocal
		// looks at the socket's own network namespace.
		spoof := src.IsValid() && !IsLocal(src)
		return setOptions(rc, o, spoof)
	}
}

// setOptions sets o on the socket behind rc; spoof adds the transparent and
// freebind options a non-local source address needs, and makes failing to
// set them an error.
func setOptions(rc syscall.RawConn, o Options, spoof bool) error {
	var err error
	cerr := rc.Control(func(fd uintptr) {
		err = setOptionsFD(int(fd), o, spoof)
	})
	if cerr != nil {
		return fmt.Errorf("sockopt: %w", cerr)
	}
	return err
}

func setOptionsFD(fd int, o Options, spoof bool) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("sockopt: get SO_DOMAIN: %w", err)
	}
	v6 := domain == unix.AF_INET6
	if o.Transparent || o.RequireTransparent || spoof {
		err := setTransparent(fd, v6)
		if err != nil && (o.RequireTransparent || spoof) {
			return err
		}
	}
	if o.Freebind || spoof {
		if err := setFreebind(fd, v6); err != nil {
			return err
		}
	}
	if o.ReusePort {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fmt.Errorf("sockopt: set SO_REUSEPORT: %w", err)
		}
	}
	if o.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark)); err != nil {
			return fmt.Errorf("sockopt: set SO_MARK %#x: %w", o.Mark, err)
		}
	}
	return nil
}

func setTransparent(fd int, v6 bool) error {
	if v6 {
		// IPV6_TRANSPARENT sets the same socket flag as IP_TRANSPARENT,
		// so it covers IPv4-mapped traffic on a dual-stack socket too.
		if err := unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1); err != nil {
			return fmt.Errorf("sockopt: set IPV6_TRANSPARENT: %w", err)
		}
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
		return fmt.Errorf("sockopt: set IP_TRANSPARENT: %w", err)
	}
	return nil
}

func setFreebind(fd int, v6 bool) error {
	if v6 {
		if err := unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_FREEBIND, 1); err != nil {
			return fmt.Errorf("sockopt: set IPV6_FREEBIND: %w", err)
		}
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_FREEBIND, 1); err != nil {
		return fmt.Errorf("sockopt: set IP_FREEBIND: %w", err)
	}
	return nil
}

// TransparentEnabled reports whether IP_TRANSPARENT (IPV6_TRANSPARENT) is
// set on l's socket, that is whether asking for it took effect. ztunnel
// spoofs source addresses for a listener's connections only then
// (SPEC §2.5). A listener without a socket (not a syscall.Conn) reports
// false.
func TransparentEnabled(l net.Listener) bool {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	on := false
	err = rc.Control(func(fd uintptr) {
		level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
		if domain, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && domain == unix.AF_INET6 {
			level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
		}
		v, err := unix.GetsockoptInt(int(fd), level, opt)
		on = err == nil && v != 0
	})
	return err == nil && on
}

// IsLocal reports whether ip is a local address in the calling thread's
// network namespace: assigned to an interface, or inside a local route such
// as 127.0.0.0/8, so that a socket can bind it without IP_FREEBIND or
// IP_TRANSPARENT. It asks the kernel directly, by binding a throwaway TCP
// socket to ip (port 0), which is cheaper than listing interface addresses
// and matches what bind(2) will do. Invalid, unspecified, multicast and
// broadcast addresses are never local. (With the sysctl
// net.ipv4.ip_nonlocal_bind=1 every address binds, and so is reported local.)
func IsLocal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Addr: ip.As4()}
	} else {
		family = unix.AF_INET6
		sa6 := &unix.SockaddrInet6{Addr: ip.As16()}
		if zone := ip.Zone(); zone != "" {
			ifi, err := net.InterfaceByName(zone)
			if err != nil {
				return false
			}
			sa6.ZoneId = uint32(ifi.Index)
		}
		sa = sa6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Bind(fd, sa) == nil
}
