package dns

import (
	"math/rand/v2"
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/state"
)

// This file is the pure part of the DNS proxy: which mesh service, or which
// pod of a headless service, a name means to a client, and which addresses
// answer it (SPEC §10.1). Names here are lower case, without the trailing
// dot.

// alias is one candidate name for a requested name.
type alias struct {
	name string
	// stripped, if not "", is the requested name with a search domain
	// removed, from which this alias came: the answer then carries a CNAME
	// from the requested name to it.
	stripped string
}

// match is the service, or the pod, a requested name resolved to.
type match struct {
	svc *state.Service  // or nil when pod is set
	pod *state.Workload // a headless service's pod, or nil
	// host is the hostname that matched: the alias itself or, for a
	// service, a wildcard ("*.example.com") of it.
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

// find returns the service or pod name means to the client, if any: for
// each alias in turn, a service of the alias or of one of its wildcards,
// else a pod the alias names (as ztunnel#1918 orders them).
func (m *matcher) find(name string) (match, bool) {
	for _, a := range m.aliases(name) {
		for _, host := range wildcards(a.name) {
			if svc := m.service(host); svc != nil {
				return match{svc: svc, host: host, alias: a}, true
			}
		}
		if pod := m.headlessPod(a.name); pod != nil {
			return match{pod: pod, host: a.name, alias: a}, true
		}
	}
	return match{}, false
}

// service returns the service of hostname host that the client sees, if
// any.
func (m *matcher) service(host string) *state.Service {
	var candidates []*state.Service
	for _, svc := range m.snap.ServicesByHostname(host) {
		// A service without VIPs is answered only when it is a Kubernetes
		// headless service; others are forwarded.
		if len(svc.VIPs) == 0 && !m.headless(svc) {
			continue
		}
		if svc.Visibility == state.VisibilityNamespace && svc.Namespace != m.client.Namespace {
			continue
		}
		candidates = append(candidates, svc)
	}
	return bestService(candidates, m.client.Namespace, m.preferred)
}

// headless reports whether svc is a Kubernetes headless service: no VIPs,
// and a hostname in the cluster's svc domain. xDS says no more (ztunnel
// judges the same way, and so takes a ServiceEntry without addresses for
// such a hostname for one).
func (m *matcher) headless(svc *state.Service) bool {
	return len(svc.VIPs) == 0 && strings.HasSuffix(svc.Hostname, ".svc."+m.domain)
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

// headlessPod returns the pod name means when it has the form
// <pod>.<service>.<ns>.svc.<domain> of a headless service's pod, or nil.
// istiod sends no pod's spec.hostname or spec.subdomain, so, as
// ztunnel#1918 does, <pod> is a workload's name and <service>.<ns> one of
// its services, which must be headless; among several such workloads,
// bestPod picks.
func (m *matcher) headlessPod(name string) *state.Workload {
	short, ok := trimDomain(name, "svc."+m.domain)
	if !ok || labelCount(short) != 3 {
		return nil
	}
	pod, host, _ := strings.Cut(name, ".")
	var candidates []*state.Workload
	for w := range m.snap.WorkloadsByName(pod) {
		if m.backsHeadless(w, host) {
			candidates = append(candidates, w)
		}
	}
	return bestPod(candidates, m.client.Namespace, m.client.ClusterID)
}

// backsHeadless reports whether w is an endpoint of a headless service of
// hostname host, in any namespace.
func (m *matcher) backsHeadless(w *state.Workload, host string) bool {
	for key := range w.Services {
		if _, h, _ := strings.Cut(key, "/"); h != host {
			continue
		}
		if svc := m.snap.ServiceByKey(key); svc != nil && m.headless(svc) {
			return true
		}
	}
	return false
}

// bestPod ranks the pods one name may mean as ztunnel#1918 does: the first
// in the client's namespace and cluster wins at once; else the first in
// its cluster; else the first in its namespace; else the first.
func bestPod(ws []*state.Workload, clientNS, clientCluster string) *state.Workload {
	var best *state.Workload
	bestRank := 0 // higher is better; ties keep the first
	for _, w := range ws {
		rank := 1
		switch sameNS, sameCluster := w.Namespace == clientNS, w.ClusterID == clientCluster; {
		case sameNS && sameCluster:
			return w
		case sameCluster:
			rank = 3
		case sameNS:
			rank = 2
		}
		if rank > bestRank {
			best, bestRank = w, rank
		}
	}
	return best
}

// familyAllowed reports whether records of qtype may answer for svc (nil
// for a pod): not AAAA with IPv6 off, nor the other family of a
// single-stack service (a headless service's pods may be dual-stack when it
// is not). A pod answers with its own addresses, as in ztunnel, whatever
// its service's families.
func familyAllowed(svc *state.Service, qtype uint16, ipv6 bool) bool {
	switch {
	case qtype == dns.TypeAAAA && !ipv6:
		return false
	case svc == nil:
		return true
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

// addresses returns, shuffled, the addresses of found of qtype's family
// that the client can use: a pod's own, whatever their network (as
// ztunnel); a service's VIPs on the client's network; or for a headless
// service the first such address of each endpoint's workload.
func (m *matcher) addresses(found match, qtype uint16, ipv6 bool) []netip.Addr {
	var out []netip.Addr
	switch svc := found.svc; {
	case found.pod != nil:
		for _, a := range found.pod.Addresses {
			if ofFamily(a.Unmap(), qtype, ipv6) {
				out = append(out, a.Unmap())
			}
		}
	case len(svc.VIPs) > 0:
		for _, vip := range svc.VIPs {
			a := vip.Address.Unmap()
			if vip.Network == m.client.Network && ofFamily(a, qtype, ipv6) {
				out = append(out, a)
			}
		}
	default:
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
