package dns

import (
	"math/rand/v2"
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/state"
)

// This file is the pure part of the DNS proxy: which mesh service a name
// means to a client, and which addresses answer it (SPEC §10.1). Names here
// are lower case, without the trailing dot.

// alias is one candidate name for a requested name.
type alias struct {
	name string
	// stripped, if not "", is the requested name with a search domain
	// removed, from which this alias came: the answer then carries a CNAME
	// from the requested name to it.
	stripped string
}

// match is the service a requested name resolved to.
type match struct {
	svc *state.Service
	// host is the hostname that matched: the alias itself or a wildcard
	// ("*.example.com") of it.
	host  string
	alias alias
}

// matcher finds services for one client.
type matcher struct {
	snap      *state.Snapshot
	client    *state.Workload
	domain    string   // cluster domain, "cluster.local"
	search    []string // the client's search domains
	preferred string   // PREFERED_SERVICE_NAMESPACE, or ""
}

// labelCount returns the number of labels of name ("" has none).
func labelCount(name string) int {
	if name == "" {
		return 0
	}
	return dns.CountLabel(name + ".")
}

// hasDomain reports whether name ends with the labels of domain and has at
// least one label more.
func hasDomain(name, domain string) bool {
	return len(name) > len(domain)+1 && strings.HasSuffix(name, domain) && name[len(name)-len(domain)-1] == '.'
}

// trimDomain returns name without domain, if hasDomain(name, domain).
func trimDomain(name, domain string) (string, bool) {
	if !hasDomain(name, domain) {
		return "", false
	}
	return name[:len(name)-len(domain)-1], true
}

// kubeFQDNs returns the Kubernetes names a short name may stand for, by its
// label count: <svc> in the client's namespace, <svc>.<ns>, <pod>.<subdomain>
// in the client's namespace, <svc>.<ns>.svc, <pod>.<subdomain>.<ns>(.svc).
func (m *matcher) kubeFQDNs(name string) []string {
	svcDomain := "svc." + m.domain
	nsDomain := m.client.Namespace + "." + svcDomain
	switch labelCount(name) {
	case 1:
		return []string{name + "." + nsDomain}
	case 2:
		return []string{name + "." + svcDomain, name + "." + nsDomain}
	case 3:
		if hasDomain(name, "svc") {
			return []string{name + "." + m.domain, name + "." + svcDomain}
		}
		return []string{name + "." + svcDomain}
	case 4:
		if hasDomain(name, "svc") {
			return []string{name + "." + m.domain}
		}
	}
	return nil
}

// aliases lists the candidate names of name, in the order they are tried,
// each once: the name, its Kubernetes expansions, then for each search
// domain it ends with the name without it and that name's expansions.
func (m *matcher) aliases(name string) []alias {
	var out []alias
	seen := map[string]bool{}
	add := func(a alias) {
		if !seen[a.name] {
			seen[a.name] = true
			out = append(out, a)
		}
	}
	add(alias{name: name})
	for _, n := range m.kubeFQDNs(name) {
		add(alias{name: n})
	}
	for _, sd := range m.search {
		stripped, ok := trimDomain(name, sd)
		if !ok {
			continue
		}
		add(alias{name: stripped, stripped: stripped})
		for _, n := range m.kubeFQDNs(stripped) {
			add(alias{name: n, stripped: stripped})
		}
	}
	return out
}

// wildcards returns name and then its wildcards of decreasing specificity:
// www.example.com, *.example.com, *.com.
func wildcards(name string) []string {
	out := []string{name}
	for {
		_, rest, ok := strings.Cut(name, ".")
		if !ok || rest == "" {
			return out
		}
		out = append(out, "*."+rest)
		name = rest
	}
}

// find returns the service name means to the client, if any.
func (m *matcher) find(name string) (match, bool) {
	headlessSuffix := ".svc." + m.domain
	for _, a := range m.aliases(name) {
		for _, host := range wildcards(a.name) {
			var candidates []*state.Service
			for _, svc := range m.snap.ServicesByHostname(host) {
				// A service without VIPs is answered only when it is a
				// Kubernetes headless service; others are forwarded.
				if len(svc.VIPs) == 0 && !strings.HasSuffix(svc.Hostname, headlessSuffix) {
					continue
				}
				if svc.Visibility == state.VisibilityNamespace && svc.Namespace != m.client.Namespace {
					continue
				}
				candidates = append(candidates, svc)
			}
			if svc := bestService(candidates, m.client.Namespace, m.preferred); svc != nil {
				return match{svc: svc, host: host, alias: a}, true
			}
		}
	}
	return match{}, false
}

// bestService ranks services of one hostname as ztunnel does: one in the
// client's namespace wins at once; else the last canonical one; else one in
// the preferred namespace; else the first.
func bestService(svcs []*state.Service, clientNS, preferred string) *state.Service {
	var best *state.Service
	canonical := false
	for _, s := range svcs {
		switch {
		case s.Namespace == clientNS:
			return s
		case s.Canonical:
			best, canonical = s, true
		case preferred != "" && s.Namespace == preferred && !canonical:
			best = s
		case best == nil:
			best = s
		}
	}
	return best
}

// familyAllowed reports whether records of qtype may answer for svc: not
// AAAA with IPv6 off, nor the other family of a single-stack service (a
// headless service's pods may be dual-stack when it is not).
func familyAllowed(svc *state.Service, qtype uint16, ipv6 bool) bool {
	switch {
	case qtype == dns.TypeAAAA && !ipv6:
		return false
	case svc.IPFamilies == state.FamiliesIPv4Only && qtype == dns.TypeAAAA:
		return false
	case svc.IPFamilies == state.FamiliesIPv6Only && qtype == dns.TypeA:
		return false
	}
	return true
}

// ofFamily reports whether a answers a query of qtype.
func ofFamily(a netip.Addr, qtype uint16, ipv6 bool) bool {
	if a.Is4() {
		return qtype == dns.TypeA
	}
	return qtype == dns.TypeAAAA && ipv6
}

// addresses returns, shuffled, the addresses of svc of qtype's family that
// the client can use: the VIPs on the client's network, or for a headless
// service the first such address of each endpoint's workload.
func (m *matcher) addresses(svc *state.Service, qtype uint16, ipv6 bool) []netip.Addr {
	var out []netip.Addr
	if len(svc.VIPs) > 0 {
		for _, vip := range svc.VIPs {
			a := vip.Address.Unmap()
			if vip.Network == m.client.Network && ofFamily(a, qtype, ipv6) {
				out = append(out, a)
			}
		}
	} else {
		for uid := range svc.Endpoints.UIDs() {
			w := m.snap.WorkloadByUID(uid)
			if w == nil {
				continue
			}
			for _, a := range w.Addresses {
				if ofFamily(a.Unmap(), qtype, ipv6) {
					out = append(out, a.Unmap())
					break
				}
			}
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
