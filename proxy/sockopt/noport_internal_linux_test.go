package sockopt

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBindAddressNoPort checks the kernel behaviour setBindAddressNoPort
// relies on, for both families: with the option, a bind to port 0 takes the
// address and no port (IPv6 sockets honour the SOL_IP option); without it,
// bind allocates a port.
func TestBindAddressNoPort(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		ip := netip.MustParseAddr(addr)
		for _, noPort := range []bool{true, false} {
			port, err := boundPort(ip, noPort)
			if err != nil {
				if ip.Is6() {
					t.Skipf("no IPv6 loopback: %v", err)
				}
				t.Fatal(err)
			}
			if got := port != 0; got == noPort {
				t.Errorf("bind %v:0 with IP_BIND_ADDRESS_NO_PORT=%v took port %d", ip, noPort, port)
			}
		}
	}
}

// boundPort binds a new TCP socket to ip, port 0, optionally after
// setBindAddressNoPort, and returns the port getsockname reports.
func boundPort(ip netip.Addr, noPort bool) (int, error) {
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: ip.As16()}
	if ip.Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Addr: ip.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if noPort {
		setBindAddressNoPort(fd)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return 0, err
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return 0, err
	}
	switch got := got.(type) {
	case *unix.SockaddrInet4:
		return got.Port, nil
	case *unix.SockaddrInet6:
		return got.Port, nil
	}
	return 0, nil
}
