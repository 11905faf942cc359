package certs

import (
	"errors"
	"fmt"
)

// Sentinel errors. Handshake and validation failures wrap one of these, so
// callers can classify them with errors.Is.
var (
	// ErrEmptyChain: a Cert was built without a leaf.
	ErrEmptyChain = errors.New("certs: empty certificate chain")
	// ErrNoRoots: a Cert was built without trust anchors.
	ErrNoRoots = errors.New("certs: no root certificates")
	// ErrKeyMismatch: the private key does not belong to the leaf.
	ErrKeyMismatch = errors.New("certs: private key does not match leaf certificate")
	// ErrIdentityMismatch: the leaf does not carry exactly the expected
	// SPIFFE identity, or an issuer returned a cert for another identity.
	ErrIdentityMismatch = errors.New("certs: certificate identity mismatch")
	// ErrUntrusted: the chain does not verify to the trusted roots (this
	// includes expired and not-yet-valid certificates).
	ErrUntrusted = errors.New("certs: certificate chain not trusted")
	// ErrNoPeerCertificate: the peer presented no certificate.
	ErrNoPeerCertificate = errors.New("certs: no peer certificate")
	// ErrChainTooLong: the peer presented more certificates than we verify.
	ErrChainTooLong = errors.New("certs: peer certificate chain too long")
	// ErrBadLeaf: the peer leaf is not usable as a workload certificate
	// (CA leaf, certificate-signing key usage).
	ErrBadLeaf = errors.New("certs: peer leaf is not a workload certificate")
	// ErrNoSPIFFEID: the leaf has no (or, for clients, more than one) URI
	// SAN, or its URI SAN is not a valid SPIFFE workload identity.
	ErrNoSPIFFEID = errors.New("certs: no valid SPIFFE identity in certificate")
	// ErrTrustDomainMismatch: the client's trust domain differs from the
	// server certificate's (SPEC §6.5, TESTPLAN S9).
	ErrTrustDomainMismatch = errors.New("certs: peer trust domain mismatch")
	// ErrSANMismatch: no URI SAN of the server leaf is in the expected set.
	ErrSANMismatch = errors.New("certs: server identity not in expected SANs")
	// ErrALPN: the handshake did not negotiate "h2".
	ErrALPN = errors.New(`certs: ALPN "h2" not negotiated`)
	// ErrCipherSuite: the peer does not support an AES-GCM TLS 1.3 suite.
	ErrCipherSuite = errors.New("certs: no AES-GCM cipher suite offered")
	// ErrVersion: the handshake did not negotiate TLS 1.3 (or 1.2 under
	// Policy.TLS12).
	ErrVersion = errors.New("certs: TLS 1.3 required")
	// ErrManagerRunning: Run was called while another Run is active.
	ErrManagerRunning = errors.New("certs: manager already running")
	// ErrExpired: the cached certificate has expired and no new one exists.
	ErrExpired = errors.New("certs: certificate expired")
	// ErrCertRevoked: a certificate of the peer's verified chain (leaf or
	// intermediate) is listed by a CRL of its issuer (SPEC §2.1, CRL_PATH).
	// The verifying side's Handshake returns an error wrapping it.
	ErrCertRevoked = errors.New("certs: peer certificate revoked")
)

// wrap adds the package prefix to an error that does not carry it yet.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("certs: %w", err)
}
