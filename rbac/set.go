package rbac

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
)

// SetSource is a Source that also serves its scope lists as prebuilt Sets.
// Evaluate detects it and then finds the candidate policies of the
// namespace and global lists through each Set's index instead of matching
// every policy; referenced policies are still resolved through Policy.
//
// NamespaceSet(ns).Policies() must be NamespacePolicies(ns), and
// GlobalSet().Policies() must be GlobalPolicies(), in the same order, so
// that Explain (which walks the lists) and Evaluate see the same policies.
// The Sets are only read and kept by no one after Evaluate returns.
type SetSource interface {
	Source
	// NamespaceSet returns the Namespace-scoped policies of namespace ns
	// as a Set, or nil when there are none.
	NamespaceSet(ns string) *Set
	// GlobalSet returns the Global-scoped policies as a Set, or nil when
	// there are none.
	GlobalSet() *Set
}

// Set is an immutable, ordered list of policies with an index that finds,
// for one connection, the enforced policies that can match it, so that a
// decision over thousands of policies matches a handful. Build it once per
// configuration change with NewSetFrom; a nil *Set is an empty Set. A Set is
// safe for concurrent use.
//
// Invariants:
//   - policies is never modified after NewSetFrom.
//   - Every enforced policy that matches a connection is a candidate for it:
//     it is in always, or in the posting of a key that lookup visits for the
//     connection (see keys.go for how keys are chosen). The converse does
//     not hold: a candidate is matched in full before it decides, so extra
//     candidates (and hash collisions between keys) cost time, never
//     correctness.
//   - A posting lists policy indexes in increasing order without repeats,
//     enforced DENY policies and enforced ALLOW policies apart; dry-run
//     policies are in no posting, because they never decide.
type Set struct {
	policies []*Policy
	// enforcedAllow is the number of enforced ALLOW policies: whether one
	// applies decides "no ALLOW matched" against "no policies", whatever
	// the candidates.
	enforcedAllow int
	// scanOnly reports whether the Set is too small to index: every
	// enforced policy is a candidate.
	scanOnly bool

	// info[i] is what the Set knows of policies[i], its keys in recs;
	// NewSetFrom reuses them.
	info []policyInfo
	recs []keyRec

	always   posting          // candidates for every connection
	ids      map[uint64]int32 // postKey → index in postings
	postings []posting
	arena    []int32 // the postings' policy indexes

	// Which keys exist, so that lookup asks for no others.
	ns, principal strDim
	sa, port      bool
	src, dst      cidrDim
}

// posting is a list of policy indexes: arena[start:mid] are enforced DENY
// policies and arena[mid:end] enforced ALLOW policies.
type posting struct{ start, mid, end uint32 }

// strDim records which kinds of string keys a Set has on one attribute:
// exact values, and the distinct lengths of prefix and suffix values,
// ascending.
type strDim struct {
	exact              bool
	prefixes, suffixes []int
}

// cidrDim records the prefix lengths of the CIDR keys a Set has on one
// address attribute, per family: bit n of v4 (of v6[n/64]) is set when a
// key of length n exists.
type cidrDim struct {
	v4 uint64
	v6 [3]uint64
}

// minIndexed is the number of policies from which a Set builds an index.
// Matching a policy that fails costs tens of nanoseconds, about what one
// key lookup costs, and a connection looks up several keys; so a smaller
// Set is scanned.
const minIndexed = 8

// NewSetFrom returns a Set of ps, in that order, which Evaluate walks as it
// would walk ps: every policy must have passed Validate, and neither ps nor
// its policies may change afterwards (the Set keeps ps). It returns nil when
// ps is empty. Building costs O(total size of the policies), less when ps
// differs little from prev's list: the analysis of each policy that prev
// also holds (the same *Policy) is reused, so that replacing one policy
// among thousands does not read them all again. prev may be nil.
func NewSetFrom(prev *Set, ps []*Policy) *Set { return newSetFrom(prev, ps, minIndexed) }

// newSetFrom is NewSetFrom with the index threshold as a parameter, for
// tests.
func newSetFrom(prev *Set, ps []*Policy, minIndexed int) *Set {
	if len(ps) == 0 {
		return nil
	}
	if len(ps) < minIndexed {
		s := &Set{policies: ps, scanOnly: true}
		for _, p := range ps {
			if !p.DryRun && p.Action == Allow {
				s.enforcedAllow++
			}
		}
		return s
	}
	b := setBuilder{s: &Set{policies: ps, info: make([]policyInfo, len(ps))}}
	b.s.recs = make([]keyRec, 0, 2*len(ps))
	var old map[*Policy]int32
	if prev != nil && len(prev.info) > 0 {
		b.s.recs = make([]keyRec, 0, len(prev.recs)+2*max(len(ps)-len(prev.policies), 8))
		old = make(map[*Policy]int32, len(prev.policies))
		for j, p := range prev.policies {
			old[p] = int32(j)
		}
	}
	for i, p := range ps {
		if j, ok := old[p]; ok {
			b.reuse(i, prev, j)
		} else {
			b.analyze(i, p)
		}
	}
	b.assemble()
	return b.s
}

// Policies returns the Set's policies in order. The slice is shared: do not
// modify it.
func (s *Set) Policies() []*Policy {
	if s == nil {
		return nil
	}
	return s.policies
}

// Len returns the number of policies in s.
func (s *Set) Len() int { return len(s.Policies()) }

// enforcedAllows returns the number of enforced ALLOW policies in s.
func (s *Set) enforcedAllows() int {
	if s == nil {
		return 0
	}
	return s.enforcedAllow
}

// policyInfo is what a Set knows of one policy: its class and its keys,
// recs[start:end].
type policyInfo struct {
	start, end uint32
	class      policyClass
}

// policyClass says how a Set treats a policy.
type policyClass uint8

const (
	classDryRun policyClass = iota // never decides: no candidate
	classKeyed                     // a candidate when it has a key of the connection (if none: never)
	classAlways                    // a rule without keys: always a candidate
)

// keyRec is one key of a policy: the map key, and what lookup must try to
// produce it (the kind; the length for a prefix or suffix, the prefix
// length and family for a CIDR).
type keyRec struct {
	key  uint64
	kind keyKind
	v4   bool
	n    uint32
}

// setBuilder holds the state of one NewSetFrom.
type setBuilder struct {
	s *Set
	// ids numbers the distinct keys in order of first use; refs lists
	// (key id, policy index) pairs in policy order, and counts the
	// DENY and ALLOW entries per key id.
	ids    map[uint64]int32
	refs   []postRef
	counts [][2]uint32
	// alwaysDeny and alwaysAllow are the policies with a rule that has no
	// key: candidates for every connection.
	alwaysDeny, alwaysAllow []int32
	// fields and bestFields are the chosen field of each Match of a
	// clause and of a rule's best clause so far, scratch.
	fields, bestFields []Fields
}

type postRef struct {
	id    int32
	index int32
	allow bool
}

// analyze derives policy i's class and keys: every key its rules need, or
// classAlways when some rule has none. A keyed policy without keys (no
// rules, or rules that can never match) is never a candidate.
func (b *setBuilder) analyze(i int, p *Policy) {
	s := b.s
	info := &s.info[i]
	info.start = uint32(len(s.recs))
	info.end = info.start
	switch {
	case p.DryRun:
		info.class = classDryRun
		return
	case p.Action == Allow:
		info.class = classKeyed | allowBit
	default:
		info.class = classKeyed
	}
	for ri := range p.Rules {
		if !b.ruleKeys(&p.Rules[ri], p.Action != Allow) {
			s.recs = s.recs[:info.start]
			info.class = classAlways | info.class&allowBit
			return
		}
	}
	keys := s.recs[info.start:]
	slices.SortFunc(keys, func(x, y keyRec) int { return cmp.Compare(x.key, y.key) })
	keys = slices.CompactFunc(keys, func(x, y keyRec) bool { return x.key == y.key })
	s.recs = s.recs[:int(info.start)+len(keys)]
	info.end = uint32(len(s.recs))
}

// allowBit marks a policyClass of an ALLOW policy.
const allowBit policyClass = 1 << 7

// reuse copies what prev knows of its policy j as policy i.
func (b *setBuilder) reuse(i int, prev *Set, j int32) {
	s, pi := b.s, prev.info[j]
	start := uint32(len(s.recs))
	s.recs = append(s.recs, prev.recs[pi.start:pi.end]...)
	s.info[i] = policyInfo{start, uint32(len(s.recs)), pi.class}
}

// assemble builds the index from the policies' classes and keys.
func (b *setBuilder) assemble() {
	s := b.s
	for i, info := range s.info {
		allow := info.class&allowBit != 0
		switch info.class &^ allowBit {
		case classDryRun:
			continue
		case classAlways:
			if allow {
				b.alwaysAllow = append(b.alwaysAllow, int32(i))
			} else {
				b.alwaysDeny = append(b.alwaysDeny, int32(i))
			}
		}
		if allow {
			s.enforcedAllow++
		}
		for _, r := range s.recs[info.start:info.end] {
			b.post(int32(i), allow, r)
		}
	}
	b.finish()
}

// post adds policy i under key r.
func (b *setBuilder) post(i int32, allow bool, r keyRec) {
	s := b.s
	if b.ids == nil {
		b.ids = make(map[uint64]int32, len(s.policies))
	}
	id, ok := b.ids[r.key]
	if !ok {
		id = int32(len(b.counts))
		b.ids[r.key] = id
		b.counts = append(b.counts, [2]uint32{})
		s.want(r)
	}
	b.refs = append(b.refs, postRef{id: id, index: i, allow: allow})
	if allow {
		b.counts[id][1]++
	} else {
		b.counts[id][0]++
	}
}

// want records that lookup must try to produce r's key.
func (s *Set) want(r keyRec) {
	str := func(d *strDim) {
		switch r.kind % 3 {
		case strExact:
			d.exact = true
		case strPrefix:
			d.prefixes = append(d.prefixes, int(r.n))
		case strSuffix:
			d.suffixes = append(d.suffixes, int(r.n))
		}
	}
	cidr := func(d *cidrDim) {
		if r.v4 {
			d.v4 |= 1 << r.n
		} else {
			d.v6[r.n/64] |= 1 << (r.n % 64)
		}
	}
	switch r.kind {
	case kindNamespace + strExact, kindNamespace + strPrefix, kindNamespace + strSuffix:
		str(&s.ns)
	case kindPrincipal + strExact, kindPrincipal + strPrefix, kindPrincipal + strSuffix:
		str(&s.principal)
	case kindServiceAccount:
		s.sa = true
	case kindPort:
		s.port = true
	case kindSrc:
		cidr(&s.src)
	case kindDst:
		cidr(&s.dst)
	}
}

// finish lays the postings out in one arena and sorts the key lengths.
func (b *setBuilder) finish() {
	s := b.s
	s.arena = make([]int32, 0, len(b.refs)+len(b.alwaysDeny)+len(b.alwaysAllow))
	s.arena = append(s.arena, b.alwaysDeny...)
	s.arena = append(s.arena, b.alwaysAllow...)
	s.always = posting{0, uint32(len(b.alwaysDeny)), uint32(len(s.arena))}

	// Each key's DENY entries start at deny[id] and its ALLOW entries at
	// allow[id]; refs are in policy order, so each list comes out sorted.
	next := make([][2]uint32, len(b.counts))
	off := uint32(len(s.arena))
	for id, c := range b.counts {
		next[id] = [2]uint32{off, off + c[0]}
		off += c[0] + c[1]
	}
	s.arena = s.arena[:off]
	for _, r := range b.refs {
		slot := &next[r.id][0]
		if r.allow {
			slot = &next[r.id][1]
		}
		s.arena[*slot] = r.index
		*slot++
	}
	s.ids = b.ids
	s.postings = make([]posting, len(b.counts))
	for id, c := range b.counts {
		end := next[id][1]
		s.postings[id] = posting{end - c[0] - c[1], end - c[1], end}
	}
	for _, d := range []*strDim{&s.ns, &s.principal} {
		d.prefixes = sortedLengths(d.prefixes)
		d.suffixes = sortedLengths(d.suffixes)
	}
}

func sortedLengths(ls []int) []int {
	if len(ls) == 0 {
		return nil
	}
	slices.Sort(ls)
	return slices.Clip(slices.Compact(ls))
}

// Keys are 64-bit hashes of (attribute kind, value). Strings hash with
// FNV-1a, which can be computed incrementally over the pieces of the
// principal, and so over all its prefixes (or, run backwards, suffixes) in
// one pass.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// keyKind says what a key is made of.
type keyKind uint8

const (
	kindNamespace      keyKind = 0 // + strExact, strPrefix or strSuffix
	kindPrincipal      keyKind = 3 // + strExact, strPrefix or strSuffix
	kindServiceAccount keyKind = 6
	kindPort           keyKind = 7
	kindSrc            keyKind = 8
	kindDst            keyKind = 9
)

const (
	strExact  keyKind = 0
	strPrefix keyKind = 1
	strSuffix keyKind = 2
)

// postKey combines kind and a value hash into a map key.
func postKey(k keyKind, h uint64) uint64 {
	return mix64(h + uint64(k)*0x9e3779b97f4a7c15)
}

// mix64 is the splitmix64 finalizer: it spreads the bits of x.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// fnvReverse hashes the bytes of s from last to first.
func fnvReverse(h uint64, s string) uint64 {
	for i := len(s) - 1; i >= 0; i-- {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

func serviceAccountHash(ns, sa string) uint64 {
	return fnvString(fnvString(fnvOffset, ns)*fnvPrime, sa)
}

// cidrHash hashes a masked prefix. IPv4 and IPv6 keys differ even when the
// 16-byte forms agree.
func cidrHash(p netip.Prefix) uint64 {
	a := p.Addr().As16()
	hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	tag := uint64(p.Bits()) << 1
	if p.Addr().Is4() {
		tag |= 1
	}
	return mix64(hi ^ mix64(lo^mix64(tag)))
}
