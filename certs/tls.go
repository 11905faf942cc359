package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/gozt/gozt/certs/identity"
)

// alpnH2 is the only application protocol HBONE speaks (SPEC §2.1).
const alpnH2 = "h2"

// maxPeerChainLen bounds how many certificates a peer may present. Istio
// chains are leaf + a few intermediates (+ maybe the root); refusing longer
// chains before path building keeps hostile chains cheap (TESTPLAN item 35).
const maxPeerChainLen = 8

// Cipher suites (SPEC §2.1: TLS13_AES_256_GCM_SHA384, TLS13_AES_128_GCM_SHA256).
//
// Go 1.26's crypto/tls does not let a program choose TLS 1.3 suites:
// Config.CipherSuites applies to TLS 1.0–1.2 only, and the TLS 1.3 list and
// its order are fixed (crypto/tls defaults.go: AES-128-GCM, AES-256-GCM,
// ChaCha20-Poly1305, with ChaCha20 first when the local CPU lacks AES-GCM
// hardware or, on a server, when the client prefers it). The only built-in
// restriction is FIPS 140-3 mode (GODEBUG=fips140=on), which is process-wide
// and changes much more than cipher suites. So gozt differs from ztunnel:
//
//   - Server: a client that offers no AES-GCM TLS 1.3 suite is refused
//     before the handshake proceeds (ztunnel would fail with "no shared
//     cipher"), so the set of accepted clients is the same. But if the
//     client offers both and prefers ChaCha20 (a Go client without AES
//     hardware), Go negotiates ChaCha20-Poly1305 where ztunnel would use
//     AES-GCM.
//   - Server and client: between AES-GCM suites Go prefers AES-128 over
//     AES-256; ztunnel prefers AES-256.
//   - Client: Go always offers ChaCha20-Poly1305 too, and a non-ztunnel
//     server may pick it; it is accepted (all three suites are AEADs of
//     equal standing in RFC 8446). ztunnel never offers it.
func offersAESGCM(suites []uint16) bool {
	return slices.Contains(suites, tls.TLS_AES_128_GCM_SHA256) ||
		slices.Contains(suites, tls.TLS_AES_256_GCM_SHA384)
}

// ServerConfig is the inbound HBONE (15008) TLS config (SPEC §2.1, §6.5):
// TLS 1.3 only, ALPN "h2" required, session tickets disabled, the
// certificate from get (called once per handshake with the handshake's
// context; an error aborts the handshake), and a client certificate
// required. The client chain must verify to the server cert's roots for
// client auth, the client leaf must not be a CA, must carry exactly one URI
// SAN, which must be a valid SPIFFE workload identity (PeerIdentity) whose
// trust domain equals the server cert's trust domain. Any SAN with a NUL or
// other control byte fails the handshake.
func ServerConfig(get func(ctx context.Context) (*Cert, error)) *tls.Config {
	if get == nil {
		panic("certs: ServerConfig: nil get")
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{alpnH2},
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAnyClientCert,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if !offersAESGCM(hello.CipherSuites) {
				return nil, ErrCipherSuite
			}
			c, err := get(hello.Context())
			if err != nil {
				return nil, fmt.Errorf("certs: server certificate: %w", err)
			}
			return serverConfigFor(c), nil
		},
	}
}

// serverConfigFor is the per-handshake config that serves c and verifies
// the client against c's roots and trust domain.
func serverConfigFor(c *Cert) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{alpnH2},
		SessionTicketsDisabled: true,
		Certificates:           []tls.Certificate{*c.TLSCertificate()},
		ClientAuth:             tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyClient(c, &cs, time.Now())
		},
	}
}

// verifyClient checks an inbound client (SPEC §6.5): chain to c's roots,
// workload leaf, one SPIFFE URI SAN in c's trust domain.
func verifyClient(c *Cert, cs *tls.ConnectionState, now time.Time) error {
	if err := checkProtocol(cs); err != nil {
		return err
	}
	if err := verifyChain(c, cs.PeerCertificates, x509.ExtKeyUsageClientAuth, now); err != nil {
		return err
	}
	sans, err := uriSANs(cs.PeerCertificates[0])
	if err != nil {
		return err
	}
	// An X.509-SVID has exactly one URI SAN (SPIFFE X509-SVID §2); with
	// more, "who is the client" would be ambiguous (TESTPLAN item 32).
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
	return nil
}

// ClientConfig is the outbound HBONE TLS config (SPEC §2.1, §6.5): TLS 1.3
// only, ALPN "h2" required, no SNI (ServerName empty; use tls.Client, since
// tls.Dial fills ServerName from the address), no session resumption, and
// client certificate c. The server chain must verify to c's roots for
// server auth, the server leaf must not be a CA, and at least one URI SAN
// of the server leaf must exactly equal one entry of expectedSANs (SPIFFE
// URI strings such as "spiffe://cluster.local/ns/a/sa/b"). DNS and IP SANs
// are ignored. An empty expectedSANs matches no server.
func ClientConfig(c *Cert, expectedSANs []string) *tls.Config {
	if c == nil {
		panic("certs: ClientConfig: nil Cert")
	}
	want := slices.Clone(expectedSANs)
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{alpnH2},
		Certificates:       []tls.Certificate{*c.TLSCertificate()},
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(c, want, &cs, time.Now())
		},
	}
}

// verifyServer checks an outbound server: chain to c's roots, workload
// leaf, one URI SAN exactly in want.
func verifyServer(c *Cert, want []string, cs *tls.ConnectionState, now time.Time) error {
	if err := checkProtocol(cs); err != nil {
		return err
	}
	if err := verifyChain(c, cs.PeerCertificates, x509.ExtKeyUsageServerAuth, now); err != nil {
		return err
	}
	sans, err := uriSANs(cs.PeerCertificates[0])
	if err != nil {
		return err
	}
	for _, s := range sans {
		if slices.Contains(want, s) {
			return nil
		}
	}
	return fmt.Errorf("%w: server URI SANs %q, expected one of %q", ErrSANMismatch, sans, want)
}

// checkProtocol enforces TLS 1.3 and ALPN h2 on a completed negotiation.
// crypto/tls lets a peer that sends no ALPN extension through with no
// protocol; HBONE requires h2 (TESTPLAN item 36).
func checkProtocol(cs *tls.ConnectionState) error {
	if cs.Version != tls.VersionTLS13 {
		return ErrVersion
	}
	if cs.NegotiatedProtocol != alpnH2 {
		return ErrALPN
	}
	return nil
}

// verifyChain verifies peer (leaf first) to c's roots at now for usage, and
// that the leaf is a workload certificate, not a CA.
func verifyChain(c *Cert, peer []*x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	if len(peer) == 0 {
		return ErrNoPeerCertificate
	}
	if len(peer) > maxPeerChainLen {
		return fmt.Errorf("%w: %d certificates", ErrChainTooLong, len(peer))
	}
	leaf := peer[0]
	if leaf.IsCA || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 {
		return ErrBadLeaf
	}
	opts := x509.VerifyOptions{
		Roots:         c.RootPool(),
		Intermediates: intermediatePool(peer[1:]),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	return nil
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
