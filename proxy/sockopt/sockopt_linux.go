package sockopt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

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
	return func(network, _ string, rc syscall.RawConn) error {
		return control(rc, func(fd int) error {
			v6, err := socketIsIPv6(network, fd)
			if err != nil {
				return err
			}
			return setOptionsFD(fd, v6, o)
		})
	}
}

func dialControl(src netip.Addr, o Options) controlFunc {
	return func(network, _ string, rc syscall.RawConn) error {
		return control(rc, func(fd int) error {
			v6, err := socketIsIPv6(network, fd)
			if err != nil {
				return err
			}
			if src.IsValid() {
				// The net.Dialer binds src next, then connects.
				if err := prepareSource(fd, v6, src); err != nil {
					return err
				}
			}
			return setOptionsFD(fd, v6, o)
		})
	}
}

// control calls fn with the socket behind rc and returns fn's error.
func control(rc syscall.RawConn, fn func(fd int) error) error {
	var err error
	cerr := rc.Control(func(fd uintptr) {
		err = fn(int(fd))
	})
	if cerr != nil {
		return fmt.Errorf("sockopt: %w", cerr)
	}
	return err
}

// socketIsIPv6 reports whether fd, the socket a Control function was given
// for network, is an AF_INET6 socket. Package net names the socket's family
// in the network it passes ("tcp4" or "tcp6", also for a dual-stack
// listener's AF_INET6 socket: net's ctrlNetwork), which saves a getsockopt
// on every upstream dial; any other network asks the socket.
func socketIsIPv6(network string, fd int) (bool, error) {
	switch network {
	case "tcp4", "udp4":
		return false, nil
	case "tcp6", "udp6":
		return true, nil
	}
	return isIPv6Socket(fd)
}

// isIPv6Socket reports whether fd is an AF_INET6 socket.
func isIPv6Socket(fd int) (bool, error) {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return false, fmt.Errorf("sockopt: get SO_DOMAIN: %w", err)
	}
	return domain == unix.AF_INET6, nil
}

// prepareSource readies a dial socket for binding src (see Dialer). It sets
// IP_BIND_ADDRESS_NO_PORT, then IP_TRANSPARENT and IP_FREEBIND, the options
// SPEC §2.5 puts on every source-preserving upstream socket; with them any
// src binds, so whether src is local need not be asked. Only when
// IP_TRANSPARENT is not permitted does it ask IsLocal: a local src then
// binds plainly, and a non-local one fails with the IP_TRANSPARENT error
// (EPERM) before anything is sent. It runs on the thread that made the
// socket, so IsLocal looks at the socket's own network namespace.
func prepareSource(fd int, v6 bool, src netip.Addr) error {
	setBindAddressNoPort(fd)
	if err := setTransparent(fd, v6); err != nil {
		if IsLocal(src) {
			return nil
		}
		return err
	}
	return setFreebind(fd, v6)
}

// setBindAddressNoPort sets IP_BIND_ADDRESS_NO_PORT, so that a later bind to
// port 0 takes only the address and connect picks the port. A bind to port
// 0 without it searches the ephemeral range for a port no other socket on
// that address holds (TIME_WAIT ones included), under the bind hash locks:
// one parity of the range first, so past about 14,000 sockets from one
// address (the inbound proxy spoofing one busy client) every bind scans
// thousands of ports, and past the whole range it fails with EADDRINUSE.
// Worse, connect skips every port that a bind took while any socket holds
// it, so those ports also starve unbound dials in the whole namespace
// (BenchmarkDialSpoofedSource's unbound dials failed with EADDRNOTAVAIL).
// connect instead needs only a free 4-tuple, and reuses loopback TIME_WAIT
// ports under net.ipv4.tcp_tw_reuse's default.
//
// The option is set at SOL_IP on IPv6 sockets too: Linux has no IPv6
// variant; ipv6_setsockopt hands SOL_IP options on non-raw sockets to the
// IPv4 code, and __inet6_bind checks the same flag as __inet_bind
// (net/ipv6/af_inet6.c, net/ipv4/af_inet.c; option added in Linux 4.2).
// TestBindAddressNoPort checks both families. On an older kernel setting
// it fails and bind picks the port as before, so the error is ignored.
func setBindAddressNoPort(fd int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
}

// setOptionsFD sets o on fd, an IPv6 socket if v6.
func setOptionsFD(fd int, v6 bool, o Options) error {
	if o.Transparent || o.RequireTransparent {
		err := setTransparent(fd, v6)
		if err != nil && o.RequireTransparent {
			return err
		}
	}
	if o.Freebind {
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
	if o.UserTimeout > 0 {
		ms := (o.UserTimeout + time.Millisecond - 1) / time.Millisecond
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(min(ms, math.MaxInt32))); err != nil {
			return fmt.Errorf("sockopt: set TCP_USER_TIMEOUT %v: %w", o.UserTimeout, err)
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
// IP_TRANSPARENT. Invalid, unspecified, multicast and broadcast addresses
// are never local. (With the sysctl net.ipv4.ip_nonlocal_bind=1 every
// address binds, and so is reported local.)
//
// It asks the kernel directly, by binding a throwaway TCP socket to ip with
// IP_BIND_ADDRESS_NO_PORT, which checks the address exactly as bind(2) will
// and allocates no port, so its cost (four system calls, a few µs) does not
// grow with the number of sockets using ip. Listing interface addresses
// instead, or caching them, would be slower per call or stale, and would
// have to be kept per network namespace, since in-pod mode calls this in
// each pod's namespace.
func IsLocal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	family := unix.AF_INET
	if ip.Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var sa unix.Sockaddr
	if ip.Is4() {
		sa = &unix.SockaddrInet4{Addr: ip.As4()}
	} else {
		sa6 := &unix.SockaddrInet6{Addr: ip.As16()}
		if zone := ip.Zone(); zone != "" {
			id, ok := zoneIndex(fd, zone)
			if !ok {
				return false
			}
			sa6.ZoneId = id
		}
		sa = sa6
	}
	setBindAddressNoPort(fd)
	return unix.Bind(fd, sa) == nil
}

// zoneIndex returns the index of the interface an IPv6 zone names, asking
// the kernel with SIOCGIFINDEX on fd (one ioctl, where net.InterfaceByName
// dumps every interface over netlink). Like package net, it takes a zone
// that names no interface as a decimal index.
func zoneIndex(fd int, zone string) (uint32, bool) {
	if ifr, err := unix.NewIfreq(zone); err == nil && unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr) == nil {
		return ifr.Uint32(), true
	}
	n, err := strconv.ParseUint(zone, 10, 32)
	return uint32(n), err == nil
}
