package istioca

import (
	"crypto/x509"
	"sync"
)

// maxCACerts bounds caCache: Istio's chains hold a root or two and maybe an
// intermediate, so a handful covers a root rotation with room to spare; a
// CA that sends more distinct ones than this only costs parsing again.
const maxCACerts = 16

// caCache keeps the CA certificates (intermediates and roots) of earlier
// responses, parsed, keyed by their DER bytes, so that every certificate of
// a node shares one parsed copy of its chain's CA part instead of holding
// its own (the larger part of a certificate's memory: bench/NOTES.md, the
// node scenario) and parsing it again per CSR. Leaves are
// never kept: each is new. A parsed x509.Certificate is never modified
// after parsing, so sharing one is safe. The zero value is ready.
type caCache struct {
	mu    sync.Mutex
	certs map[string]*x509.Certificate
}

// parse returns der parsed, from the cache when a CA certificate of the
// same bytes was parsed before. A CA certificate just parsed is kept; when
// the cache is full it is emptied first, so it holds at most maxCACerts.
func (cc *caCache) parse(der []byte) (*x509.Certificate, error) {
	if cc == nil {
		return x509.ParseCertificate(der)
	}
	cc.mu.Lock()
	c, ok := cc.certs[string(der)]
	cc.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := x509.ParseCertificate(der)
	if err != nil || !c.IsCA {
		return c, err
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if len(cc.certs) >= maxCACerts || cc.certs == nil {
		cc.certs = make(map[string]*x509.Certificate, maxCACerts)
	}
	cc.certs[string(der)] = c
	return c, nil
}
