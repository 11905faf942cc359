package rbac

import (
	"math"
	"net/netip"
)

// How a Set chooses the keys of a policy.
//
// A policy matches only if one of its rules does, and a rule only if every
// clause holds, so any one clause of a rule is a necessary condition for it.
// A clause holds only if one of its Matches does, and a Match only if each
// of its non-empty fields holds. So a clause gives a finite key set when
// every Match that can hold has a positive field whose entries are all
// keyable: exact, prefix or suffix namespaces and principals, service
// accounts, destination ports, and source or destination CIDRs. The policy
// is posted under the keys of one such clause per rule, and a connection
// looks up its own keys (its namespace, every prefix and suffix length
// present, its masked addresses for every prefix length present, ...).
//
// A rule without such a clause (no clauses, a clause without matches, a
// Match with only not_ fields or presence matches, an empty Match in a DENY
// policy, which holds) makes its policy a candidate for every connection.
// An empty Match in an ALLOW policy never holds, so it adds no key; a clause
// made only of those never holds, and neither does its rule, which then
// adds nothing.

// clauseState classifies a clause for indexing.
type clauseState uint8

const (
	clauseKeyed   clauseState = iota // holds only if one of its keys does
	clauseUnkeyed                    // may hold with no key present
	clauseNever                      // never holds
)

// ruleKeys appends to b.keys the keys of r's most selective keyed clause and
// reports whether r had one (or never matches, and so needs no key). It
// reads each Match once: policies are scattered in memory, and building a
// Set is bound by cache misses.
func (b *setBuilder) ruleKeys(r *Rule, deny bool) bool {
	best, bestScore := -1, -1
	for ci := range r.Clauses {
		b.fields = b.fields[:0]
		score, st := b.clauseScore(&r.Clauses[ci], deny)
		switch {
		case st == clauseNever:
			return true
		case st == clauseKeyed && score > bestScore:
			best, bestScore = ci, score
			b.bestFields = append(b.bestFields[:0], b.fields...)
		}
	}
	if best < 0 {
		return false
	}
	c := &r.Clauses[best]
	for mi, f := range b.bestFields {
		if f != 0 {
			b.fieldKeys(&c.Matches[mi], f)
		}
	}
	return true
}

// clauseScore classifies c and, for a keyed clause, returns how selective
// its keys are: the least selective of its Matches' chosen fields, which it
// appends to b.fields (0 for a Match that never holds).
func (b *setBuilder) clauseScore(c *Clause, deny bool) (int, clauseState) {
	if len(c.Matches) == 0 {
		return 0, clauseUnkeyed
	}
	score, keyed := 1<<30, false
	for mi := range c.Matches {
		m := &c.Matches[mi]
		f, s := bestField(m)
		if f == 0 {
			if !deny && m.Fields() == 0 {
				b.fields = append(b.fields, 0)
				continue // never holds in an ALLOW policy
			}
			return 0, clauseUnkeyed
		}
		b.fields = append(b.fields, f)
		keyed = true
		score = min(score, s)
	}
	if !keyed {
		return 0, clauseNever
	}
	return score, clauseKeyed
}

// bestField returns the positive keyable field of m whose keys are likely
// the most selective, with its score, or 0. Scores are rough guesses of how
// few connections a key admits: a principal names one workload identity, a
// port admits nearly everything sent to the workload. Ties go to the first
// field in the order below.
func bestField(m *Match) (best Fields, bestScore int) {
	bestScore = -1
	if len(m.Principals) > 0 {
		if s, ok := stringScore(m.Principals, 100, 50); ok {
			best, bestScore = FieldPrincipals, s
		}
	}
	if len(m.ServiceAccounts) > 0 && 90 > bestScore {
		best, bestScore = FieldServiceAccounts, 90
	}
	if len(m.Namespaces) > 0 {
		if s, ok := stringScore(m.Namespaces, 80, 40); ok && s > bestScore {
			best, bestScore = FieldNamespaces, s
		}
	}
	if len(m.SourceIPs) > 0 {
		if s, ok := cidrScore(m.SourceIPs, 2); ok && s > bestScore {
			best, bestScore = FieldSourceIPs, s
		}
	}
	if len(m.DestinationIPs) > 0 {
		if s, ok := cidrScore(m.DestinationIPs, 1); ok && s > bestScore {
			best, bestScore = FieldDestinationIPs, s
		}
	}
	if len(m.DestinationPorts) > 0 && 10 > bestScore {
		best, bestScore = FieldDestinationPorts, 10
	}
	return best, bestScore
}

// stringScore scores a namespace or principal list: exact entries score
// exact, prefix and suffix entries their length up to maxAffix; a presence
// (or unknown) entry makes the list unkeyable.
func stringScore(ms []StringMatch, exact, maxAffix int) (int, bool) {
	score := exact
	for i := range ms {
		switch ms[i].Kind {
		case Exact:
		case Prefix, Suffix:
			if len(ms[i].Value) > math.MaxUint32 {
				return 0, false // its length would not fit in a keyRec
			}
			score = min(score, len(ms[i].Value), maxAffix)
		default:
			return 0, false
		}
	}
	return score, true
}

// cidrScore scores a CIDR list by its shortest prefix (an IPv6 bit counts a
// quarter of an IPv4 bit), times weight.
func cidrScore(ps []netip.Prefix, weight int) (int, bool) {
	score := 1 << 30
	for _, p := range ps {
		if !p.IsValid() {
			return 0, false
		}
		p = canonicalPrefix(p)
		bits := p.Bits()
		if !p.Addr().Is4() {
			bits /= 4
		}
		score = min(score, bits*weight)
	}
	return score, true
}

// fieldKeys appends the keys of field f of m to the policy's keys.
func (b *setBuilder) fieldKeys(m *Match, f Fields) {
	s := b.s
	switch f {
	case FieldPrincipals:
		s.recs = stringKeys(s.recs, kindPrincipal, m.Principals)
	case FieldNamespaces:
		s.recs = stringKeys(s.recs, kindNamespace, m.Namespaces)
	case FieldServiceAccounts:
		for _, sa := range m.ServiceAccounts {
			s.recs = append(s.recs, keyRec{key: postKey(kindServiceAccount, serviceAccountHash(sa.Namespace, sa.ServiceAccount)), kind: kindServiceAccount})
		}
	case FieldDestinationPorts:
		for _, p := range m.DestinationPorts {
			s.recs = append(s.recs, keyRec{key: postKey(kindPort, uint64(p)), kind: kindPort})
		}
	case FieldSourceIPs:
		s.recs = cidrKeys(s.recs, kindSrc, m.SourceIPs)
	case FieldDestinationIPs:
		s.recs = cidrKeys(s.recs, kindDst, m.DestinationIPs)
	}
}

func stringKeys(recs []keyRec, kind keyKind, ms []StringMatch) []keyRec {
	for _, sm := range ms {
		switch sm.Kind {
		case Exact:
			recs = append(recs, keyRec{key: postKey(kind+strExact, fnvString(fnvOffset, sm.Value)), kind: kind + strExact})
		case Prefix:
			recs = append(recs, keyRec{key: postKey(kind+strPrefix, fnvString(fnvOffset, sm.Value)), kind: kind + strPrefix, n: uint32(len(sm.Value))})
		case Suffix:
			recs = append(recs, keyRec{key: postKey(kind+strSuffix, fnvReverse(fnvOffset, sm.Value)), kind: kind + strSuffix, n: uint32(len(sm.Value))})
		}
	}
	return recs
}

// cidrKeys keys each prefix in the form canonicalAddr gives addresses: a
// mapped prefix of length ≥ 96 as the IPv4 prefix it spells, host bits
// cleared.
func cidrKeys(recs []keyRec, kind keyKind, ps []netip.Prefix) []keyRec {
	for _, p := range ps {
		p = canonicalPrefix(p).Masked()
		recs = append(recs, keyRec{key: postKey(kind, cidrHash(p)), kind: kind, v4: p.Addr().Is4(), n: uint32(p.Bits())})
	}
	return recs
}
