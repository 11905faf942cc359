package dns

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ResolvConf is what the DNS proxy takes from a resolv.conf(5): the
// upstream servers, the search list, and the timeout and attempts options.
type ResolvConf struct {
	Servers  []netip.AddrPort
	Search   []string // lower case, without trailing dots
	Timeout  time.Duration
	Attempts int
}

// ReadResolvConf reads a resolv.conf file (gozt's own /etc/resolv.conf, as
// ztunnel reads its own, SPEC §10.1).
func ReadResolvConf(path string) (ResolvConf, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("dns: read %s: %w", path, err)
	}
	port, err := strconv.ParseUint(cc.Port, 10, 16)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("dns: %s: port %q: %w", path, cc.Port, err)
	}
	rc := ResolvConf{Timeout: time.Duration(cc.Timeout) * time.Second, Attempts: cc.Attempts}
	for _, s := range cc.Servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return ResolvConf{}, fmt.Errorf("dns: %s: nameserver %q: %w", path, s, err)
		}
		rc.Servers = append(rc.Servers, netip.AddrPortFrom(a.Unmap(), uint16(port)))
	}
	for _, d := range cc.Search {
		if d = strings.ToLower(strings.TrimSuffix(d, ".")); d != "" {
			rc.Search = append(rc.Search, d)
		}
	}
	return rc, nil
}
