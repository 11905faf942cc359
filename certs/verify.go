package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/gozt/gozt/certs/identity"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// maxPeerChainLen bounds how many certificates a peer may present. Istio
// chains are leaf + a few intermediates (+ maybe the root); refusing longer
// chains before path building keeps hostile chains cheap (TESTPLAN item 35).
const maxPeerChainLen = 8

// verifyClient checks an inbound client (SPEC §2.1, §6.5), once per
// handshake: TLS 1.3 and h2, then the client leaf's URI SAN as encoded (one
// only, a strict SPIFFE workload identity in c's trust domain), then the
// chain as an X.509-SVID of c's trust domain, verified to the roots c
// trusts now, valid for client auth, with some verified path on which c's
// CRL (if any) revokes nothing. An accepted client is recorded as needing
// the root it verified to (trustSet.need).
//
// SPEC §2.1 asks for at least one SPIFFE URI SAN in the server's trust
// domain, and ztunnel picks among several. An X.509-SVID has exactly one
// (SPIFFE X509-SVID §2), istiod issues exactly one (SPEC §6.2), and with
// more "who is the client" would be ambiguous, so gozt refuses a client leaf
// with two (TESTPLAN item 32), as x509svid.Verify does too.
func verifyClient(c *Cert, p Policy, cs *tls.ConnectionState, now time.Time) error {
	if err := checkProtocol(cs, p); err != nil {
		return err
	}
	peer := cs.PeerCertificates
	if err := checkChainLen(peer); err != nil {
		return err
	}
	sans, err := uriSANs(peer[0])
	if err != nil {
		return err
	}
	if len(sans) != 1 {
		return fmt.Errorf("%w: client leaf has %d URI SANs, want 1", ErrNoSPIFFEID, len(sans))
	}
	id, err := identity.Parse(sans[0])
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoSPIFFEID, err)
	}
	if id.TrustDomain != c.Identity.TrustDomain {
		return fmt.Errorf("%w: client %q, server %q", ErrTrustDomainMismatch, id.TrustDomain, c.Identity.TrustDomain)
	}
	trusted := c.trusted()
	chains, err := verifySVID(peer, x509bundle.FromX509Authorities(c.td, trusted.certs), sans[0], now)
	if err != nil {
		return err
	}
	if chains, err = c.crl.unrevoked(chains); err != nil {
		return err
	}
	if !allowsUsage(chains, x509.ExtKeyUsageClientAuth) {
		return fmt.Errorf("%w: client chain not valid for client authentication", ErrUntrusted)
	}
	trusted.need(soleAnchor(chains), peer[0].NotAfter)
	return nil
}

// verifyServer checks an outbound server (SPEC §2.1, §6.5), once per
// handshake: TLS 1.3 and h2, a leaf that is not a CA, a chain to the roots
// c trusts now valid for server auth on which c's CRL (if any) revokes
// nothing, and some URI SAN of the leaf exactly in want. An accepted
// server is recorded as needing the root it verified to.
//
// This is not x509svid.Verify, which would refuse what SPEC §2.1 and
// ztunnel accept: a server leaf with several URI SANs of which one is
// expected, and a server leaf of a trust domain other than c's (expected
// identities may name any trust domain; the roots decide).
func verifyServer(c *Cert, p Policy, want []string, cs *tls.ConnectionState, now time.Time) error {
	if err := checkProtocol(cs, p); err != nil {
		return err
	}
	peer := cs.PeerCertificates
	if err := checkChainLen(peer); err != nil {
		return err
	}
	leaf := peer[0]
	if isCALeaf(leaf) {
		return ErrBadLeaf
	}
	trusted := c.trusted()
	opts := x509.VerifyOptions{
		Roots:         trusted.pool,
		Intermediates: intermediatePool(peer[1:]),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	chains, err := leaf.Verify(opts)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	if chains, err = c.crl.unrevoked(chains); err != nil {
		return err
	}
	sans, err := uriSANs(leaf)
	if err != nil {
		return err
	}
	for _, s := range sans {
		if slices.Contains(want, s) {
			trusted.need(soleAnchor(chains), leaf.NotAfter)
			return nil
		}
	}
	return fmt.Errorf("%w: server URI SANs %q, expected one of %q", ErrSANMismatch, sans, want)
}

// checkProtocol enforces TLS 1.3 (or 1.2 under p.TLS12) and ALPN h2 on a
// completed negotiation. crypto/tls lets a peer that sends no ALPN
// extension through with no protocol; HBONE requires h2 (TESTPLAN item 36).
func checkProtocol(cs *tls.ConnectionState, p Policy) error {
	if cs.Version < p.minVersion() {
		return ErrVersion
	}
	if cs.NegotiatedProtocol != alpnH2 {
		return ErrALPN
	}
	return nil
}

// checkChainLen refuses an empty peer chain and one longer than
// maxPeerChainLen, before any path building.
func checkChainLen(peer []*x509.Certificate) error {
	if len(peer) == 0 {
		return ErrNoPeerCertificate
	}
	if len(peer) > maxPeerChainLen {
		return fmt.Errorf("%w: %d certificates", ErrChainTooLong, len(peer))
	}
	return nil
}

// verifySVID verifies chain (leaf first) as an X.509-SVID with
// x509svid.Verify at now: the leaf has exactly one URI SAN, a SPIFFE ID; it
// is not a CA and may not sign certificates or CRLs; and the chain verifies
// to the roots bundle holds for the leaf's trust domain (bundle holds one
// trust domain, so a leaf of another fails) for any extended key usage.
// x509svid reads the SAN through net/url (x509.Certificate.URIs); san is
// the SAN as uriSANs read it, byte for byte, and the two must agree. It
// returns the verified chains, each ending in a root.
func verifySVID(chain []*x509.Certificate, bundle *x509bundle.Bundle, san string, now time.Time) ([][]*x509.Certificate, error) {
	id, chains, err := x509svid.Verify(chain, bundle, x509svid.WithTime(now))
	switch {
	case err != nil && isCALeaf(chain[0]):
		return nil, fmt.Errorf("%w: %v", ErrBadLeaf, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrUntrusted, err)
	case id.String() != san:
		return nil, fmt.Errorf("%w: URI SAN %q read as %q", ErrNoSPIFFEID, san, id)
	}
	return chains, nil
}

// isCALeaf reports whether leaf is a CA or may sign certificates or CRLs,
// which no workload certificate may (SPIFFE X509-SVID §5.2).
func isCALeaf(leaf *x509.Certificate) bool {
	return leaf.IsCA || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0
}

// allowsUsage reports whether some chain in chains may be used for usage by
// crypto/x509's rule for VerifyOptions.KeyUsages: every certificate in the
// chain lists no extended key usage, lists ExtKeyUsageAny, or lists usage.
// x509svid.Verify accepts any usage; ztunnel (webpki) and SPEC's peers
// require client auth of clients and server auth of servers.
func allowsUsage(chains [][]*x509.Certificate, usage x509.ExtKeyUsage) bool {
	for _, chain := range chains {
		ok := true
		for _, cert := range chain {
			if len(cert.ExtKeyUsage) == 0 && len(cert.UnknownExtKeyUsage) == 0 {
				continue
			}
			if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny) && !slices.Contains(cert.ExtKeyUsage, usage) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// PeerIdentity returns the SPIFFE identity of the peer of a handshake made
// with ServerConfig or ClientConfig (which verified it): the first URI SAN
// of the peer leaf that parses as a SPIFFE workload identity. For inbound
// connections that is the client's only URI SAN.
func PeerIdentity(cs *tls.ConnectionState) (identity.Identity, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return identity.Identity{}, ErrNoPeerCertificate
	}
	sans, err := uriSANs(cs.PeerCertificates[0])
	if err != nil {
		return identity.Identity{}, err
	}
	for _, s := range sans {
		if id, err := identity.Parse(s); err == nil {
			return id, nil
		}
	}
	return identity.Identity{}, ErrNoSPIFFEID
}
