package certs

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/gozt/gozt/certs/identity"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Cert is a workload certificate: leaf (+ intermediates), its private key
// and the roots it trusts.
//
// A Cert is immutable after NewCert: the exported fields must not be
// modified, and the cached TLS certificate is built once and shared by
// every handshake that uses the Cert. A Cert a Manager hands out verifies
// peers against the Manager's roots (RootPool, TrustedRoots), which change
// while the CA rotates its root; any other verifies them against Roots.
//
// A Cert keeps its chain as DER only (in its TLS certificate, whose Leaf
// is nil): a parsed leaf is kilobytes of heap held for every identity on a
// node (bench/NOTES.md, the node scenario), and nothing on the data path
// reads it (crypto/tls signs with Key; the validity is kept apart). Chain
// parses it again when asked.
type Cert struct {
	Identity identity.Identity
	Key      crypto.Signer
	Roots    []*x509.Certificate // the CA's root bundle for this leaf (may be several during root rotation)

	tlsCert   tls.Certificate // Certificate: the chain's DER, leaf first; Leaf nil
	notBefore time.Time       // the leaf's validity
	notAfter  time.Time
	td        spiffeid.TrustDomain
	own       *ownTrust         // Roots, the trust of a Cert no Manager handed out
	trust     *trust            // the Manager's roots, or nil: own
	anchor    *x509.Certificate // the one root of Roots the chain verifies to, or nil if several
	crl       *CRL              // revocations peers are checked against, or nil
}

// WithCRL returns a copy of c whose handshakes (ServerConfig, ClientConfig)
// also refuse peers that crl revokes; a nil crl checks none. The copy
// shares c's certificates, key and roots.
func (c *Cert) WithCRL(crl *CRL) *Cert {
	cp := *c
	cp.crl = crl
	return &cp
}

// trusted returns the roots c verifies peers against now.
func (c *Cert) trusted() *trustSet {
	if c.trust != nil {
		return c.trust.set.Load()
	}
	return c.own.get()
}

// ownTrust is a Cert's Roots as a trustSet, built on first use. A Cert a
// Manager hands out verifies peers against the Manager's roots and never
// builds it: a CertPool and a record per root, about 1 KB per identity on
// a node (bench/NOTES.md, the node scenario). A copy of the Cert shares it.
type ownTrust struct {
	once  sync.Once
	roots []*x509.Certificate
	set   *trustSet
}

func (o *ownTrust) get() *trustSet {
	o.once.Do(func() { o.set = ownTrustSet(o.roots) })
	return o.set
}

// CRL returns the revocations c's handshakes check, or nil.
func (c *Cert) CRL() *CRL { return c.crl }

// NewCert validates and assembles a Cert. It checks that the chain is
// non-empty, that key belongs to the leaf, that the leaf carries exactly one
// URI SAN and that it is id, that roots is non-empty, and that the chain is
// an X.509-SVID (x509svid.Verify: the leaf is not a CA and may not sign
// certificates or CRLs) that verifies to roots at time.Now() for any
// extended key usage.
func NewCert(id identity.Identity, chain []*x509.Certificate, key crypto.Signer, roots []*x509.Certificate) (*Cert, error) {
	if len(chain) == 0 || chain[0] == nil {
		return nil, ErrEmptyChain
	}
	if len(roots) == 0 {
		return nil, ErrNoRoots
	}
	leaf := chain[0]
	if key == nil || !publicKeyEqual(key.Public(), leaf.PublicKey) {
		return nil, ErrKeyMismatch
	}
	if id.IsZero() {
		return nil, fmt.Errorf("%w: zero identity", ErrIdentityMismatch)
	}
	sans, err := uriSANs(leaf)
	if err != nil {
		return nil, err
	}
	if len(sans) != 1 || sans[0] != id.String() {
		return nil, fmt.Errorf("%w: leaf URI SANs %q, want [%q]", ErrIdentityMismatch, sans, id.String())
	}
	td, err := spiffeid.TrustDomainFromString(id.TrustDomain)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrIdentityMismatch, err)
	}
	c := &Cert{
		Identity:  id,
		Key:       key,
		Roots:     append([]*x509.Certificate(nil), roots...),
		notBefore: leaf.NotBefore,
		notAfter:  leaf.NotAfter,
		td:        td,
	}
	for _, r := range c.Roots {
		if r == nil {
			return nil, ErrNoRoots
		}
	}
	c.own = &ownTrust{roots: c.Roots}
	der := make([][]byte, len(chain))
	for i, cert := range chain {
		if cert == nil {
			return nil, fmt.Errorf("%w: certificate %d of the chain is nil", ErrEmptyChain, i)
		}
		der[i] = cert.Raw
	}
	chains, err := verifySVID(chain, x509bundle.FromX509Authorities(td, c.Roots), sans[0], time.Now())
	if err != nil {
		return nil, err
	}
	c.anchor = soleAnchor(chains)
	c.tlsCert = tls.Certificate{Certificate: der, PrivateKey: key}
	return c, nil
}

// Chain returns the certificate chain, leaf first, then intermediates,
// parsed again from its DER on every call (for the admin pages, not a
// handshake). For certificates parsed from DER, as every caller's are,
// this parses what NewCert was given and cannot fail; were it to, Chain
// returns the certificates before the one that did not parse.
func (c *Cert) Chain() []*x509.Certificate {
	out := make([]*x509.Certificate, 0, len(c.tlsCert.Certificate))
	for _, der := range c.tlsCert.Certificate {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			break
		}
		out = append(out, cert)
	}
	return out
}

// publicKeyEqual reports whether a and b are the same public key.
func publicKeyEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// intermediatePool returns a pool holding certs, or nil if there are none.
func intermediatePool(certs []*x509.Certificate) *x509.CertPool {
	if len(certs) == 0 {
		return nil
	}
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// TLSCertificate returns the certificate for crypto/tls. It is shared:
// callers must not modify it.
func (c *Cert) TLSCertificate() *tls.Certificate { return &c.tlsCert }

// RootPool returns the pool of roots c verifies peers against now: for a
// Cert a Manager handed out, the Manager's current roots. It is shared:
// callers must not modify it.
func (c *Cert) RootPool() *x509.CertPool { return c.trusted().pool }

// TrustedRoots returns the roots c verifies peers against now (a new
// slice): for a Cert a Manager handed out, every root the Manager trusts,
// which during a root rotation holds old and new roots.
func (c *Cert) TrustedRoots() []*x509.Certificate {
	return append([]*x509.Certificate(nil), c.trusted().certs...)
}

// NotBefore returns the start of the leaf's validity.
func (c *Cert) NotBefore() time.Time { return c.notBefore }

// NotAfter returns the end of the leaf's validity.
func (c *Cert) NotAfter() time.Time { return c.notAfter }

// RefreshTime returns when the certificate should be renewed: halfway
// through its validity, NotBefore + (NotAfter-NotBefore)/2 (SPEC §6.3).
func (c *Cert) RefreshTime() time.Time {
	nb, na := c.NotBefore(), c.NotAfter()
	return nb.Add(na.Sub(nb) / 2)
}

// validAt reports whether the leaf has not expired at now.
func (c *Cert) validAt(now time.Time) bool {
	return now.Before(c.NotAfter())
}
