package istioca

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

// ErrBadResponse: the CA's cert_chain is not well-formed PEM certificates.
var ErrBadResponse = errors.New("istioca: malformed certificate chain")

// maxChainCerts bounds the certificates accepted in one response (leaf,
// intermediates and roots together); Istio's are a handful.
const maxChainCerts = 32

// parseResponse turns a CreateCertificate cert_chain into a validated Cert
// for id and key (SPEC §6.2): element 0 is the leaf (any certificates after
// the leaf in the same element are intermediates), the last element is the
// root bundle (every certificate in it is trusted), and the elements in
// between are intermediates. It refuses an empty chain, a leaf without a
// root element, a leaf that is a CA, is not for exactly id, is not valid at
// now or does not hold key, and a chain that does not verify to the roots.
// CA certificates come from cache (nil: parse every one) when earlier
// responses held the same bytes.
func parseResponse(id identity.Identity, key crypto.Signer, chain []string, now time.Time, cache *caCache) (*certs.Cert, error) {
	if len(chain) == 0 {
		return nil, certs.ErrEmptyChain
	}
	if len(chain) == 1 {
		return nil, fmt.Errorf("%w: response holds only the leaf", certs.ErrNoRoots)
	}
	var all [][]*x509.Certificate
	total := 0
	for i, elem := range chain {
		cs, err := parsePEMCerts(elem, cache)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		if total += len(cs); total > maxChainCerts {
			return nil, fmt.Errorf("%w: more than %d certificates", ErrBadResponse, maxChainCerts)
		}
		all = append(all, cs)
	}
	leaf := all[0][0]
	served := all[0] // leaf, then intermediates
	for _, cs := range all[1 : len(all)-1] {
		served = append(served, cs...)
	}
	roots := all[len(all)-1]
	if err := checkLeaf(id, key, leaf, now); err != nil {
		return nil, err
	}
	// NewCert checks again, byte-exactly (certs' own SAN reader), and
	// verifies the chain to roots.
	return certs.NewCert(id, served, key, roots)
}

// checkLeaf checks the properties of leaf that give the clearest errors:
// not a CA, exactly one URI SAN equal to id, valid at now, holding key.
func checkLeaf(id identity.Identity, key crypto.Signer, leaf *x509.Certificate, now time.Time) error {
	if leaf.IsCA {
		return fmt.Errorf("%w: leaf is a CA certificate", certs.ErrBadLeaf)
	}
	// Always checked, not only when impersonating: a CA (or a confused
	// istiod) answering with another workload's identity must never give
	// us a certificate we would serve as id (TESTPLAN S10, ztunnel #167).
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		got := make([]string, len(leaf.URIs))
		for i, u := range leaf.URIs {
			got[i] = u.String()
		}
		return fmt.Errorf("%w: leaf URI SANs %q, requested %q", certs.ErrIdentityMismatch, got, id.String())
	}
	switch {
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("%w: leaf not valid before %v (now %v)", certs.ErrUntrusted, leaf.NotBefore, now)
	case !now.Before(leaf.NotAfter):
		return fmt.Errorf("%w: leaf expired at %v (now %v)", certs.ErrExpired, leaf.NotAfter, now)
	}
	if k, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(leaf.PublicKey) {
		return fmt.Errorf("%w: leaf is not for the key of our CSR", certs.ErrKeyMismatch)
	}
	return nil
}

// parsePEMCerts parses one cert_chain element: one or more PEM CERTIFICATE
// blocks, through cache (which may be nil). Text around the blocks is
// ignored, as PEM readers do.
func parsePEMCerts(s string, cache *caCache) ([]*x509.Certificate, error) {
	rest := []byte(s)
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: PEM block %q", ErrBadResponse, b.Type)
		}
		c, err := cache.parse(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadResponse, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no PEM certificate", ErrBadResponse)
	}
	return out, nil
}
