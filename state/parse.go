package state

import (
	"fmt"
	"net/netip"
	"strings"
)

// The spellings parsed here are shared by the config dump and the local
// config file (SPEC §5.5, §8.2).

// ParseGatewayDestination parses "network/IP" (an address) or
// "namespace/hostname" (a hostname): the part after the first '/' decides.
func ParseGatewayDestination(dest string, port uint16) (*GatewayAddress, error) {
	left, right, ok := strings.Cut(dest, "/")
	if !ok || right == "" {
		return nil, fmt.Errorf("destination %q is not network/IP or namespace/hostname", dest)
	}
	if a, err := netip.ParseAddr(right); err == nil {
		if a.Zone() != "" {
			return nil, fmt.Errorf("destination %q: zoned address", dest)
		}
		return &GatewayAddress{Address: &NetworkAddress{left, a.Unmap()}, HBONEMTLSPort: port}, nil
	}
	if left == "" {
		return nil, fmt.Errorf("destination %q: empty namespace", dest)
	}
	return &GatewayAddress{Hostname: &NamespacedHostname{left, right}, HBONEMTLSPort: port}, nil
}

// ParseNetworkAddress parses "network/IP" ("/IP" is the default network).
func ParseNetworkAddress(s string) (NetworkAddress, error) {
	network, ip, ok := strings.Cut(s, "/")
	if !ok {
		return NetworkAddress{}, fmt.Errorf("%q is not network/IP", s)
	}
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Zone() != "" {
		return NetworkAddress{}, fmt.Errorf("%q: invalid IP %q", s, ip)
	}
	return NetworkAddress{network, a.Unmap()}, nil
}

// ParseNetworkPrefix parses "network/CIDR" ("/10.0.0.0/8" is the default
// network).
func ParseNetworkPrefix(s string) (NetworkPrefix, error) {
	network, cidr, ok := strings.Cut(s, "/")
	if !ok {
		return NetworkPrefix{}, fmt.Errorf("%q is not network/CIDR", s)
	}
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return NetworkPrefix{}, fmt.Errorf("%q: invalid CIDR %q", s, cidr)
	}
	return NetworkPrefix{network, normalizePrefix(p)}, nil
}

// ParsePrefixes parses CIDR strings; a bare IP is a full-length prefix.
// IPv4-mapped addresses are unmapped.
func ParsePrefixes(l []string) ([]netip.Prefix, error) {
	if len(l) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, 0, len(l))
	for _, s := range l {
		p, err := ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// ParsePrefix parses one CIDR string; a bare IP is a full-length prefix.
func ParsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q", s)
	}
	return normalizePrefix(p), nil
}
