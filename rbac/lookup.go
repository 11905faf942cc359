package rbac

import (
	"math/bits"
	"net/netip"
)

// maxHits bounds the postings one lookup collects on the stack. A
// connection that hits more (only a set with very many prefix or suffix
// lengths could) is evaluated against every policy of the Set instead.
const maxHits = 16

// hits is the postings a connection's keys found in one Set.
type hits struct {
	n    int
	all  bool // more than maxHits: every policy is a candidate
	list [maxHits]posting
}

func (h *hits) add(p posting) {
	if p.start == p.end {
		return
	}
	if h.n == len(h.list) {
		h.all = true
		return
	}
	h.list[h.n] = p
	h.n++
}

// lookup collects into h the postings of every key of in that s has.
func (s *Set) lookup(in *input, h *hits) {
	if s == nil {
		return
	}
	if s.scanOnly {
		h.all = true
		return
	}
	h.add(s.always)
	if len(s.ids) == 0 {
		return
	}
	// Without an identity the namespace is "" (see namespaceIn), while
	// principals and service accounts match nothing.
	ns := [1]string{in.id.Namespace}
	s.stringLookups(kindNamespace, &s.ns, ns[:], len(ns[0]), h)
	if in.hasID {
		s.stringLookups(kindPrincipal, &s.principal, in.principal[:], in.principalLen, h)
		if s.sa {
			s.find(kindServiceAccount, serviceAccountHash(in.id.Namespace, in.id.ServiceAccount), h)
		}
	}
	if s.port {
		s.find(kindPort, uint64(in.port), h)
	}
	s.cidrLookups(kindSrc, &s.src, in.src, h)
	s.cidrLookups(kindDst, &s.dst, in.dst, h)
}

func (s *Set) find(kind keyKind, hash uint64, h *hits) {
	if id, ok := s.ids[postKey(kind, hash)]; ok {
		h.add(s.postings[id])
	}
}

// stringLookups looks up the value made of pieces (n bytes in all): whole,
// and its prefixes and suffixes of every length d records.
func (s *Set) stringLookups(kind keyKind, d *strDim, pieces []string, n int, h *hits) {
	if d.exact || len(d.prefixes) > 0 {
		need := n // bytes to hash
		if !d.exact {
			need = min(n, d.prefixes[len(d.prefixes)-1])
		}
		ls, hash, pos := d.prefixes, uint64(fnvOffset), 0
		if len(ls) > 0 && ls[0] == 0 {
			s.find(kind+strPrefix, hash, h)
			ls = ls[1:]
		}
		for _, p := range pieces {
			for i := 0; i < len(p) && pos < need; i++ {
				hash = (hash ^ uint64(p[i])) * fnvPrime
				pos++
				if len(ls) > 0 && ls[0] == pos {
					s.find(kind+strPrefix, hash, h)
					ls = ls[1:]
				}
			}
		}
		if d.exact {
			s.find(kind+strExact, hash, h)
		}
	}
	if len(d.suffixes) > 0 {
		need := min(n, d.suffixes[len(d.suffixes)-1])
		ls, hash, pos := d.suffixes, uint64(fnvOffset), 0
		if ls[0] == 0 {
			s.find(kind+strSuffix, hash, h)
			ls = ls[1:]
		}
		for j := len(pieces) - 1; j >= 0; j-- {
			p := pieces[j]
			for i := len(p) - 1; i >= 0 && pos < need; i-- {
				hash = (hash ^ uint64(p[i])) * fnvPrime
				pos++
				if len(ls) > 0 && ls[0] == pos {
					s.find(kind+strSuffix, hash, h)
					ls = ls[1:]
				}
			}
		}
	}
}

// cidrLookups looks up a, which canonicalAddr has prepared, masked to every
// prefix length of its family that d records.
func (s *Set) cidrLookups(kind keyKind, d *cidrDim, a netip.Addr, h *hits) {
	switch {
	case !a.IsValid():
	case a.Is4():
		for w := d.v4; w != 0; w &= w - 1 {
			s.findPrefix(kind, a, bits.TrailingZeros64(w), h)
		}
	default:
		for i, w := range d.v6 {
			for ; w != 0; w &= w - 1 {
				s.findPrefix(kind, a, i*64+bits.TrailingZeros64(w), h)
			}
		}
	}
}

func (s *Set) findPrefix(kind keyKind, a netip.Addr, n int, h *hits) {
	p, _ := a.Prefix(n) // a.Prefix clears the host bits, as Masked does for keys
	s.find(kind, cidrHash(p), h)
}

// Phases of evaluation, for firstMatch's allow argument.
const (
	denyPhase  = false
	allowPhase = true
)

// firstMatch returns the first enforced policy of s with the given action
// that matches in, among the candidates in h, and its decision.
func (s *Set) firstMatch(in *input, h *hits, allow bool) (Decision, bool) {
	if s == nil {
		return Decision{}, false
	}
	if h.all {
		return s.scan(in, allow)
	}
	var cur cursor
	cur.init(s, h, allow)
	for {
		i, ok := cur.next()
		if !ok {
			return Decision{}, false
		}
		p := s.policies[i]
		if rule, f := p.match(in); rule >= 0 {
			return policyDecision(p, rule, f, allow), true
		}
	}
}

// cursor walks the union of the postings' lists for one action, each
// sorted, in increasing order without repeats: a k-way merge, on the
// stack. Each list is arena[lists[i][0]:lists[i][1]].
type cursor struct {
	arena []int32
	n     int
	lists [maxHits][2]uint32
}

func (c *cursor) init(s *Set, h *hits, allow bool) {
	c.arena = s.arena
	for _, p := range h.list[:h.n] {
		l := [2]uint32{p.start, p.mid}
		if allow {
			l = [2]uint32{p.mid, p.end}
		}
		if l[0] < l[1] {
			c.lists[c.n] = l
			c.n++
		}
	}
}

// next returns the next policy index, or false when there is none.
func (c *cursor) next() (int32, bool) {
	lists := c.lists[:c.n]
	if len(lists) == 0 {
		return 0, false
	}
	i := c.arena[lists[0][0]]
	for _, l := range lists[1:] {
		i = min(i, c.arena[l[0]])
	}
	// Advance every list at i; drop the empty ones (the last list takes
	// an empty one's place and is looked at next).
	for j := 0; j < len(lists); {
		l := &lists[j]
		if c.arena[l[0]] == i {
			l[0]++
		}
		if l[0] == l[1] {
			*l = lists[len(lists)-1]
			lists = lists[:len(lists)-1]
			continue
		}
		j++
	}
	c.n = len(lists)
	return i, true
}

// scan matches every enforced policy of s with the given action, in order.
func (s *Set) scan(in *input, allow bool) (Decision, bool) {
	for _, p := range s.policies {
		if p.DryRun || (p.Action == Allow) != allow {
			continue
		}
		if rule, f := p.match(in); rule >= 0 {
			return policyDecision(p, rule, f, allow), true
		}
	}
	return Decision{}, false
}

// policyDecision is the decision of an enforced policy whose rule matched.
func policyDecision(p *Policy, rule int, f Fields, allow bool) Decision {
	if allow {
		return Decision{Allow: true, Reason: AllowedByPolicy, Policy: p, Rule: rule, Match: f}
	}
	return Decision{Reason: DeniedByPolicy, Policy: p, Rule: rule, Match: f}
}
