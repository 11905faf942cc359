package rbac

import (
	"net/netip"

	"github.com/gozt/gozt/certs/identity"
)

// input is a Conn prepared for matching: addresses canonicalized and the
// principal held as pieces, so that nothing is allocated per connection.
type input struct {
	src, dst netip.Addr
	port     uint16
	hasID    bool
	id       *identity.Identity
	// principal is the identity without "spiffe://" —
	// "td/ns/NS/sa/SA" — as the concatenation of these pieces (all empty
	// without an identity), and principalLen its length.
	principal    [5]string
	principalLen int
}

func newInput(c *Conn) input {
	in := input{
		src:   canonicalAddr(c.Src.Addr()),
		dst:   canonicalAddr(c.Dst.Addr()),
		port:  c.Dst.Port(),
		hasID: !c.Identity.IsZero(),
		id:    &c.Identity,
	}
	if in.hasID {
		in.principal = [5]string{c.Identity.TrustDomain, "/ns/", c.Identity.Namespace, "/sa/", c.Identity.ServiceAccount}
		for _, s := range in.principal {
			in.principalLen += len(s)
		}
	}
	return in
}

// canonicalAddr unmaps an IPv4-mapped IPv6 address and drops an IPv6 zone,
// either of which would make netip.Prefix.Contains report false.
func canonicalAddr(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// match returns the index of the first rule of p that matches and the fields
// that decided it, or -1.
func (p *Policy) match(in *input) (rule int, f Fields) {
	deny := p.Action != Allow
	for i := range p.Rules {
		if f, ok := p.Rules[i].match(in, deny); ok {
			return i, f
		}
	}
	return -1, 0
}

// match reports whether every clause of r is satisfied, and the union of the
// fields of the matches that satisfied them.
func (r *Rule) match(in *input, deny bool) (Fields, bool) {
	var f Fields
	for i := range r.Clauses {
		cf, ok := r.Clauses[i].match(in, deny)
		if !ok {
			return 0, false
		}
		f |= cf
	}
	return f, true
}

// match reports whether c is satisfied (a clause without matches is) and the
// fields of the first Match that holds.
func (c *Clause) match(in *input, deny bool) (Fields, bool) {
	if len(c.Matches) == 0 {
		return 0, true
	}
	for i := range c.Matches {
		if f, ok := c.Matches[i].match(in, deny); ok {
			return f, true
		}
	}
	return 0, false
}

// match reports whether m holds, and its non-empty fields if so. A Match with
// every field empty holds in a DENY policy (deliberate difference (2), see
// the package documentation) and never in an ALLOW policy.
func (m *Match) match(in *input, deny bool) (Fields, bool) {
	// An empty Match holds vacuously, so Fields (the slower test) runs
	// only for matches that hold.
	if !m.holds(in) {
		return 0, false
	}
	f := m.Fields()
	if f == 0 {
		if deny {
			return FieldEmptyMatch, true
		}
		return 0, false
	}
	return f, true
}

// holds reports whether every non-empty field of m holds for in. Cheap
// comparisons go first; the order does not change the result.
func (m *Match) holds(in *input) bool {
	switch {
	case len(m.DestinationPorts) > 0 && !containsPort(m.DestinationPorts, in.port),
		len(m.NotDestinationPorts) > 0 && containsPort(m.NotDestinationPorts, in.port),
		len(m.SourceIPs) > 0 && !containsAddr(m.SourceIPs, in.src),
		len(m.NotSourceIPs) > 0 && containsAddr(m.NotSourceIPs, in.src),
		len(m.DestinationIPs) > 0 && !containsAddr(m.DestinationIPs, in.dst),
		len(m.NotDestinationIPs) > 0 && containsAddr(m.NotDestinationIPs, in.dst),
		len(m.ServiceAccounts) > 0 && !in.serviceAccountIn(m.ServiceAccounts),
		len(m.NotServiceAccounts) > 0 && in.serviceAccountIn(m.NotServiceAccounts),
		len(m.Namespaces) > 0 && !in.namespaceIn(m.Namespaces),
		len(m.NotNamespaces) > 0 && in.namespaceIn(m.NotNamespaces),
		len(m.Principals) > 0 && !in.principalIn(m.Principals),
		len(m.NotPrincipals) > 0 && in.principalIn(m.NotPrincipals):
		return false
	}
	return true
}

// Fields returns the set of non-empty fields of m.
func (m *Match) Fields() Fields {
	return fieldIf(len(m.Namespaces), FieldNamespaces) |
		fieldIf(len(m.NotNamespaces), FieldNotNamespaces) |
		fieldIf(len(m.Principals), FieldPrincipals) |
		fieldIf(len(m.NotPrincipals), FieldNotPrincipals) |
		fieldIf(len(m.SourceIPs), FieldSourceIPs) |
		fieldIf(len(m.NotSourceIPs), FieldNotSourceIPs) |
		fieldIf(len(m.DestinationIPs), FieldDestinationIPs) |
		fieldIf(len(m.NotDestinationIPs), FieldNotDestinationIPs) |
		fieldIf(len(m.DestinationPorts), FieldDestinationPorts) |
		fieldIf(len(m.NotDestinationPorts), FieldNotDestinationPorts) |
		fieldIf(len(m.ServiceAccounts), FieldServiceAccounts) |
		fieldIf(len(m.NotServiceAccounts), FieldNotServiceAccounts)
}

func fieldIf(n int, f Fields) Fields {
	if n > 0 {
		return f
	}
	return 0
}

func containsPort(ports []uint16, p uint16) bool {
	for _, q := range ports {
		if q == p {
			return true
		}
	}
	return false
}

// containsAddr reports whether any prefix contains a, which canonicalAddr
// has prepared.
func containsAddr(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if canonicalPrefix(p).Contains(a) {
			return true
		}
	}
	return false
}

// canonicalPrefix turns an IPv4-mapped IPv6 prefix of length 96 or more into
// the IPv4 prefix it spells (::ffff:10.0.0.0/104 → 10.0.0.0/8), to match
// canonicalAddr. Shorter mapped prefixes stay IPv6 and so never contain an
// IPv4 address.
func canonicalPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// serviceAccountIn reports whether the identity's namespace and service
// account equal those of any entry; the trust domain is ignored. Without an
// identity no entry matches.
func (in *input) serviceAccountIn(sas []ServiceAccountMatch) bool {
	if !in.hasID {
		return false
	}
	for i := range sas {
		if sas[i].Namespace == in.id.Namespace && sas[i].ServiceAccount == in.id.ServiceAccount {
			return true
		}
	}
	return false
}

// namespaceIn reports whether any entry matches the identity's namespace,
// which is "" without an identity.
func (in *input) namespaceIn(ms []StringMatch) bool {
	for i := range ms {
		if ms[i].matches(in.id.Namespace) {
			return true
		}
	}
	return false
}

// principalIn reports whether any entry matches the principal. Without an
// identity no entry matches (so principals fail and not_principals hold).
func (in *input) principalIn(ms []StringMatch) bool {
	if !in.hasID {
		return false
	}
	for i := range ms {
		if ms[i].matchesPieces(&in.principal, in.principalLen) {
			return true
		}
	}
	return false
}

// matches reports whether s matches v. Values are literal: no byte is special
// (TESTPLAN S2). An unknown Kind never matches; Validate rejects it.
func (sm *StringMatch) matches(v string) bool {
	switch sm.Kind {
	case Exact:
		return v == sm.Value
	case Prefix:
		return len(v) >= len(sm.Value) && v[:len(sm.Value)] == sm.Value
	case Suffix:
		return len(v) >= len(sm.Value) && v[len(v)-len(sm.Value):] == sm.Value
	case Presence:
		return v != ""
	}
	return false
}

// matchesPieces is matches against the concatenation of pieces, whose total
// length is n, without building it.
func (sm *StringMatch) matchesPieces(pieces *[5]string, n int) bool {
	switch sm.Kind {
	case Exact:
		return len(sm.Value) == n && hasPrefixPieces(pieces, sm.Value)
	case Prefix:
		return len(sm.Value) <= n && hasPrefixPieces(pieces, sm.Value)
	case Suffix:
		return len(sm.Value) <= n && hasSuffixPieces(pieces, sm.Value)
	case Presence:
		return n > 0
	}
	return false
}

// hasPrefixPieces reports whether the concatenation of pieces starts with v.
func hasPrefixPieces(pieces *[5]string, v string) bool {
	for _, p := range pieces {
		if len(v) <= len(p) {
			return p[:len(v)] == v
		}
		if v[:len(p)] != p {
			return false
		}
		v = v[len(p):]
	}
	return v == ""
}

// hasSuffixPieces reports whether the concatenation of pieces ends with v.
func hasSuffixPieces(pieces *[5]string, v string) bool {
	for i := len(pieces) - 1; i >= 0; i-- {
		p := pieces[i]
		if len(v) <= len(p) {
			return p[len(p)-len(v):] == v
		}
		if v[len(v)-len(p):] != p {
			return false
		}
		v = v[:len(v)-len(p)]
	}
	return v == ""
}
