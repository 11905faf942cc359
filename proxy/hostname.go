package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/state"
)

// This file resolves, at connect time, the hostname of an endpoint that has
// no IPs (a ServiceEntry with DNS resolution, SPEC §3.3): ztunnel's
// resolve_workload_address.

// HostResolver resolves host names for workloads that have a hostname and
// no IPs. *dns.HostResolver is the production one.
type HostResolver interface {
	// LookupHost returns host's addresses, IPv4 and IPv6; an error means
	// none were found.
	LookupHost(ctx context.Context, host string) ([]netip.Addr, error)
}

var _ HostResolver = (*dns.HostResolver)(nil)

// The two ways on-demand resolution fails a connection, with ztunnel's
// messages (its NoResolvedAddresses and EmptyResolvedAddresses errors).
var (
	errNoResolvedAddresses    = errors.New("no ip addresses were resolved for workload")
	errEmptyResolvedAddresses = errors.New("valid dns response had no A/AAAA records for workload")
	errNoHostResolver         = errors.New("no resolver for hostname endpoints")
)

// resolveRoute completes rt, whose workload has only a hostname: the
// lookup is counted in istio_on_demand_dns_total (whether or not the answer
// was cached, as ztunnel counts it), and an address of rt.prefer's family
// is picked when there is one. A failed lookup is logged as ztunnel logs it
// ("dns lookup failed") and fails the connection before it is recorded.
func (p *Proxy) resolveRoute(r *router, src *state.Workload, rt route) (route, error) {
	p.cfg.Metrics.CountOnDemandDNS(src, rt.hostname)
	if p.cfg.Hosts == nil {
		return route{}, fmt.Errorf("%w: %s: %w", errNoResolvedAddresses, rt.workload.UID, errNoHostResolver)
	}
	addrs, err := p.cfg.Hosts.LookupHost(p.lifetime, rt.hostname)
	if err != nil {
		p.log.Warn("dns lookup failed", "hostname", rt.hostname, "error", err)
		return route{}, fmt.Errorf("%w: %s", errNoResolvedAddresses, rt.workload.UID)
	}
	ip := r.pickResolved(addrs, rt.prefer)
	if !ip.IsValid() {
		return route{}, fmt.Errorf("%w: %s", errEmptyResolvedAddresses, rt.workload.UID)
	}
	rt.setIP(ip)
	return rt, nil
}
