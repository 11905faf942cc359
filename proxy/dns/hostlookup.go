package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// This file is the on-demand resolver of workloads that have a hostname and
// no IPs (SPEC §3.3): ztunnel resolves them with its own hickory resolver,
// configured from its /etc/resolv.conf, not through the DNS proxy. Here the
// upstream exchange is the DNS proxy's (forward.go: each server in turn,
// resolv.conf's attempts and timeout, TCP after a truncated UDP answer), and
// the rest is what hickory's lookup_ip does with ztunnel's options: the
// search list and ndots, A and AAAA in parallel (A only without IPv6), and a
// cache of 4096 answers bound by their TTLs.

// Hickory's cache bounds, as ztunnel configures them (config.rs sets only
// cache_size; the TTL bounds are hickory's defaults).
const (
	hostCacheSize = 4096
	maxCacheTTL   = 86400 * time.Second // hickory MAX_TTL, one day
)

// errNoRecords is a lookup the servers answered with NXDOMAIN or without an
// address record.
var errNoRecords = errors.New("no records found")

// HostConfig configures a HostResolver; ReadHostConfig fills it from a
// resolv.conf. Zero values mean the documented defaults.
type HostConfig struct {
	// Servers are the nameservers; none means every lookup fails.
	Servers []netip.AddrPort
	// Search is the search list (lower case, without trailing dots).
	Search []string
	// Ndots is resolv.conf's ndots: a name with more dots than this is
	// tried as is before the search list, others after it (hickory's
	// rule). Unlike other fields, 0 means ndots:0; resolv.conf's default
	// is 1, which ReadHostConfig applies.
	Ndots int
	// Timeout bounds each exchange with one server; if zero 5s.
	Timeout time.Duration
	// Attempts is how many times the server list is tried; if zero 2.
	Attempts int
	// IPv4Only queries only A records (IPV6_ENABLED=false), as ztunnel's
	// Ipv4Only strategy; otherwise A and AAAA are queried in parallel.
	IPv4Only bool
}

// ReadHostConfig reads the HostConfig of a resolv.conf file (gozt's own
// /etc/resolv.conf, as ztunnel's read_system_conf reads its own).
func ReadHostConfig(path string) (HostConfig, error) {
	rc, err := ReadResolvConf(path)
	if err != nil {
		return HostConfig{}, err
	}
	// ResolvConf has no ndots (the DNS proxy forwards names as they come);
	// read it from the same file.
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return HostConfig{}, fmt.Errorf("dns: read %s: %w", path, err)
	}
	return HostConfig{Servers: rc.Servers, Search: rc.Search, Ndots: cc.Ndots,
		Timeout: rc.Timeout, Attempts: rc.Attempts}, nil
}

// HostResolver resolves host names to addresses through the upstream
// servers of a resolv.conf, caching answers for their TTL. It is safe for
// concurrent use.
type HostResolver struct {
	cfg HostConfig
	fwd *Resolver // only its upstream exchange is used: no mesh names, no metrics
	now func() time.Time

	mu    sync.Mutex
	cache map[hostKey]hostEntry
}

// hostKey is one cached question.
type hostKey struct {
	name  string // fully qualified, lower case
	qtype uint16
}

// hostEntry is one cached answer: addresses, or errNoRecords.
type hostEntry struct {
	addrs   []netip.Addr
	err     error
	expires time.Time
}

// NewHostResolver returns a HostResolver for cfg.
func NewHostResolver(cfg HostConfig) *HostResolver {
	fwd := &Resolver{cfg: Config{Upstreams: cfg.Servers, UpstreamTimeout: cfg.Timeout, UpstreamAttempts: cfg.Attempts}}
	return &HostResolver{cfg: cfg, fwd: fwd, now: time.Now, cache: make(map[hostKey]hostEntry)}
}

// LookupHost returns the addresses of host: an IP literal as is, else the
// A and AAAA records of the first candidate name (names) that has any. An
// error means no candidate had an address.
func (h *HostResolver) LookupHost(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}, nil
	}
	var last error
	for _, name := range h.names(host) {
		addrs, err := h.lookupName(ctx, name)
		if err == nil {
			return addrs, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("dns: lookup %s: %w", host, last)
}

// names returns the fully qualified names to try for host, in order, as
// hickory's build_names: a name ending in a dot alone; else, when it has
// more labels than ndots (or is localhost), the name itself and then each
// search domain appended; otherwise the search domains first and the name
// last.
func (h *HostResolver) names(host string) []string {
	host = strings.ToLower(host)
	if strings.HasSuffix(host, ".") {
		return []string{host}
	}
	labels := strings.Count(host, ".") + 1
	rawFirst := labels > h.cfg.Ndots || host == "localhost" || strings.HasSuffix(host, ".localhost")
	names := make([]string, 0, len(h.cfg.Search)+1)
	if rawFirst {
		names = append(names, host+".")
	}
	for _, s := range h.cfg.Search {
		if n := host + "." + s + "."; !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if !rawFirst && !slices.Contains(names, host+".") {
		names = append(names, host+".")
	}
	return names
}

// lookupName queries name's A records, and its AAAA records in parallel
// unless IPv4Only, and returns the union; one family failing does not fail
// the other (hickory's Ipv4AndIpv6 strategy).
func (h *HostResolver) lookupName(ctx context.Context, name string) ([]netip.Addr, error) {
	if h.cfg.IPv4Only {
		return h.query(ctx, name, dns.TypeA)
	}
	var v6 []netip.Addr
	var err6 error
	done := make(chan struct{})
	go func() {
		defer close(done)
		v6, err6 = h.query(ctx, name, dns.TypeAAAA)
	}()
	v4, err4 := h.query(ctx, name, dns.TypeA)
	<-done
	switch {
	case err4 == nil && err6 == nil:
		return append(v4, v6...), nil
	case err4 == nil:
		return v4, nil
	case err6 == nil:
		return v6, nil
	}
	return nil, err4
}

// query returns the addresses of one question, from the cache or the
// servers. Answers with records and NXDOMAIN/NODATA answers with an SOA are
// cached (hickory's response cache); failures to get an answer are not.
func (h *HostResolver) query(ctx context.Context, name string, qtype uint16) ([]netip.Addr, error) {
	key := hostKey{name: name, qtype: qtype}
	now := h.now()
	h.mu.Lock()
	e, ok := h.cache[key]
	h.mu.Unlock()
	if ok && !now.After(e.expires) {
		return e.addrs, e.err
	}
	req := new(dns.Msg)
	req.SetQuestion(name, qtype)
	resp, err := h.fwd.exchangeAll(ctx, query{req: req, dial: dialUpstream})
	if err != nil {
		return nil, err
	}
	e, ttl, err := answerOf(resp, qtype)
	if err != nil {
		return nil, err
	}
	if ttl > 0 {
		e.expires = now.Add(ttl)
		h.store(key, e, now)
	}
	return e.addrs, e.err
}

// answerOf reads the addresses of type qtype in resp, with how long the
// answer may be cached: positive answers for the smallest TTL of their
// records, negative ones for their SOA's negative TTL (RFC 2308 §5), both
// capped at one day.
func answerOf(resp *dns.Msg, qtype uint16) (hostEntry, time.Duration, error) {
	switch resp.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
	default:
		return hostEntry{}, 0, fmt.Errorf("server answered %s", dns.RcodeToString[resp.Rcode])
	}
	var e hostEntry
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(rr.A.To4()); ok && qtype == dns.TypeA {
				e.addrs = append(e.addrs, a)
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(rr.AAAA.To16()); ok && qtype == dns.TypeAAAA {
				e.addrs = append(e.addrs, a.Unmap())
			}
		}
	}
	if resp.Rcode == dns.RcodeSuccess && len(e.addrs) > 0 {
		return e, min(minTTL(resp), maxCacheTTL), nil
	}
	e = hostEntry{err: errNoRecords}
	for _, rr := range resp.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return e, min(time.Duration(min(soa.Hdr.Ttl, soa.Minttl))*time.Second, maxCacheTTL), nil
		}
	}
	return e, 0, nil
}

// minTTL is the smallest TTL of the records of resp (OPT aside).
func minTTL(resp *dns.Msg) time.Duration {
	ttl := uint32(1<<32 - 1)
	for _, section := range [][]dns.RR{resp.Answer, resp.Ns, resp.Extra} {
		for _, rr := range section {
			if rr.Header().Rrtype != dns.TypeOPT {
				ttl = min(ttl, rr.Header().Ttl)
			}
		}
	}
	return time.Duration(ttl) * time.Second
}

// store caches e under key, making room when the cache is full: expired
// entries go first, then an arbitrary one (hickory evicts by its own
// policy; only the bound matters here).
func (h *HostResolver) store(key hostKey, e hostEntry, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.cache[key]; !ok && len(h.cache) >= hostCacheSize {
		for k, old := range h.cache {
			if now.After(old.expires) {
				delete(h.cache, k)
			}
		}
		for k := range h.cache {
			if len(h.cache) < hostCacheSize {
				break
			}
			delete(h.cache, k)
		}
	}
	h.cache[key] = e
}

// dialUpstream makes a socket to a server from gozt's own network
// namespace, as ztunnel's resolver does.
func dialUpstream(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr.String())
}
