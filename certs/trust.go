package certs

import (
	"crypto/x509"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRootGrace is how long, at most, a root the CA stopped answering
// stays trusted (ManagerConfig.RootGrace): istiod's default leaf lifetime
// (SECRET_TTL), so that by then every leaf issued under it before the
// switch has expired.
const DefaultRootGrace = 24 * time.Hour

// trust is the set of roots that every certificate of one Manager verifies
// peers against: the union of the root bundles the CA has answered, less
// the old roots nothing needs any more. So when the CA rotates its root,
// a leaf of the new root and a leaf of the old one are both accepted
// while the node's leaves move over (istio/ztunnel#1679; ztunnel trusts
// only the bundle of the leaf it serves until that leaf is renewed).
//
// Invariants:
//   - Handshakes read the current trustSet without locking; learn and
//     prune hold mu, build a new set and swap it in.
//   - A root is current while the CA's latest answer lists it, and
//     retired from the first answer that does not; an answer that lists
//     it again makes it current again. Current roots are never dropped.
//   - A retired root is dropped once no leaf known to need it is still
//     valid (trustedRoot.needUntil), or grace after it was retired,
//     whichever comes first.
//   - Only a CA answer adds a root: nothing else widens what peers may
//     present.
type trust struct {
	grace time.Duration
	set   atomic.Pointer[trustSet]

	mu sync.Mutex // serializes writers; guards trustedRoot.retired
}

// trustSet is one immutable generation of a trust.
type trustSet struct {
	roots []*trustedRoot
	certs []*x509.Certificate // roots' certificates, in the same order
	pool  *x509.CertPool
}

// trustedRoot is one root of a trust, shared by every trustSet that holds
// it, so that needUntil recorded against an older set is not lost.
type trustedRoot struct {
	cert *x509.Certificate
	// needUntil is the latest NotAfter, in Unix nanoseconds, of a leaf
	// (ours or a peer's) whose every verified chain ends at this root:
	// until then some workload may present a leaf only this root
	// verifies.
	needUntil atomic.Int64
	retired   time.Time // when the CA stopped listing it, or zero; guarded by trust.mu
}

// newTrust returns an empty trust whose retired roots stay at most grace
// (if zero, DefaultRootGrace).
func newTrust(grace time.Duration) *trust {
	if grace <= 0 {
		grace = DefaultRootGrace
	}
	t := &trust{grace: grace}
	t.set.Store(newTrustSet(nil))
	return t
}

func newTrustSet(roots []*trustedRoot) *trustSet {
	s := &trustSet{roots: roots, pool: x509.NewCertPool()}
	for _, r := range roots {
		s.certs = append(s.certs, r.cert)
		s.pool.AddCert(r.cert)
	}
	return s
}

// ownTrustSet is the trust of a Cert that no Manager issued: its roots.
func ownTrustSet(roots []*x509.Certificate) *trustSet {
	rs := make([]*trustedRoot, len(roots))
	for i, r := range roots {
		rs[i] = &trustedRoot{cert: r}
	}
	return newTrustSet(rs)
}

// learn records c, just issued at now: the roots of its bundle become (or
// stay) current and the others are retired, and its leaf needs its anchor
// until it expires. It reports whether the bundle added a root the trust
// did not hold.
func (t *trust) learn(c *Cert, now time.Time) (added bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.set.Load()
	roots := old.roots
	for _, r := range old.roots {
		switch listed := containsCert(c.Roots, r.cert); {
		case listed && !r.retired.IsZero():
			r.retired = time.Time{}
		case !listed && r.retired.IsZero():
			r.retired = now
		}
	}
	for i, rc := range c.Roots {
		if old.find(rc) == nil && !containsCert(c.Roots[:i], rc) {
			roots = append(roots[:len(roots):len(roots)], &trustedRoot{cert: rc})
			added = true
		}
	}
	s := old
	if added {
		s = newTrustSet(roots)
		t.set.Store(s)
	}
	s.need(c.anchor, c.NotAfter())
	return added
}

// prune drops the retired roots whose time is up at now and returns when
// the next one's is, or zero if none is retired.
func (t *trust) prune(now time.Time, log *slog.Logger) (next time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.set.Load()
	var keep []*trustedRoot
	for _, r := range old.roots {
		if r.retired.IsZero() {
			keep = append(keep, r)
			continue
		}
		drop := r.dropAt(t.grace)
		if now.Before(drop) {
			keep = append(keep, r)
			if next.IsZero() || drop.Before(next) {
				next = drop
			}
			continue
		}
		log.Info("old root no longer trusted", "subject", r.cert.Subject.String(),
			"serial", r.cert.SerialNumber.String(), "retired", r.retired, "graceOver", !now.Before(r.retired.Add(t.grace)))
	}
	if len(keep) != len(old.roots) {
		t.set.Store(newTrustSet(keep))
	}
	return next
}

// dropAt is when the retired r stops being trusted: when the last leaf
// known to need it expires, but no later than grace after it was retired.
// Called with trust.mu held.
func (r *trustedRoot) dropAt(grace time.Duration) time.Time {
	need := r.retired
	if u := time.Unix(0, r.needUntil.Load()); u.After(need) {
		need = u
	}
	if limit := r.retired.Add(grace); limit.Before(need) {
		return limit
	}
	return need
}

// need records that a verified leaf valid until notAfter needs anchor, the
// one root its chains end at (nil, when they end at several, records
// nothing: any of them would do).
func (s *trustSet) need(anchor *x509.Certificate, notAfter time.Time) {
	r := s.find(anchor)
	if r == nil {
		return
	}
	n := notAfter.UnixNano()
	for {
		cur := r.needUntil.Load()
		if n <= cur || r.needUntil.CompareAndSwap(cur, n) {
			return
		}
	}
}

// find returns the root of s that is c, or nil.
func (s *trustSet) find(c *x509.Certificate) *trustedRoot {
	if c == nil {
		return nil
	}
	for _, r := range s.roots {
		if r.cert.Equal(c) {
			return r
		}
	}
	return nil
}

// soleAnchor returns the root every chain of chains (verified chains, each
// ending in a root) ends at, or nil if they end at several or there are
// none.
func soleAnchor(chains [][]*x509.Certificate) *x509.Certificate {
	var anchor *x509.Certificate
	for _, ch := range chains {
		r := ch[len(ch)-1]
		if anchor != nil && !anchor.Equal(r) {
			return nil
		}
		anchor = r
	}
	return anchor
}

// containsCert reports whether list holds c.
func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, l := range list {
		if l.Equal(c) {
			return true
		}
	}
	return false
}
