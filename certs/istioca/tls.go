package istioca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// TLSConfig returns a client TLS configuration for istiod (SPEC §6.5: the
// control plane gets standard host-name verification). The server chain
// must verify, for server auth, to the pool roots returns, which is called
// for every handshake so that a rotated CA_ROOT_CA file takes effect on the
// next connection. The leaf must be valid for serverName (if empty, the
// name gRPC sends as SNI, the host of the CA address) or, failing that, for
// altServerName (ALT_CA_HOSTNAME) when it is not empty.
func TLSConfig(roots func() (*x509.CertPool, error), serverName, altServerName string) *tls.Config {
	if roots == nil {
		panic("istioca: TLSConfig: nil roots")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// crypto/tls's own verification checks only one name; this one
		// checks the chain once and the name against either candidate.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			pool, err := roots()
			if err != nil {
				return fmt.Errorf("istioca: CA roots: %w", err)
			}
			name := serverName
			if name == "" {
				name = cs.ServerName
			}
			return verifyServer(pool, cs.PeerCertificates, name, altServerName)
		},
	}
}

// verifyServer verifies the CA server's chain to pool and its leaf's name.
func verifyServer(pool *x509.CertPool, peer []*x509.Certificate, name, alt string) error {
	if len(peer) == 0 {
		return errors.New("istioca: CA server sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range peer[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{
		Roots:         pool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if _, err := peer[0].Verify(opts); err != nil {
		return fmt.Errorf("istioca: CA server certificate: %w", err)
	}
	err := peer[0].VerifyHostname(name)
	if err != nil && alt != "" && peer[0].VerifyHostname(alt) == nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("istioca: CA server certificate: %w", err)
	}
	return nil
}

// TokenFile returns a Config.Token that reads the JWT at path on every call
// (projected service-account tokens are rotated in place), trimming
// surrounding white space. An empty file is an error.
func TokenFile(path string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("token file %s is empty", path)
		}
		return tok, nil
	}
}

// RootPool parses PEM certificates (CA_ROOT_CA's file contents or inline
// PEM) into a pool; it is an error if there is none.
func RootPool(pemCerts []byte) (*x509.CertPool, error) {
	cs, err := parsePEMCerts(string(pemCerts), nil)
	if err != nil {
		return nil, fmt.Errorf("istioca: CA roots: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range cs {
		pool.AddCert(c)
	}
	return pool, nil
}
