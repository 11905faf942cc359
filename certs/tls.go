package certs

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"time"
)

// alpnH2 is the only application protocol HBONE speaks (SPEC §2.1).
const alpnH2 = "h2"

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
func (p Policy) offersAESGCM(suites []uint16) bool {
	if slices.Contains(suites, tls.TLS_AES_128_GCM_SHA256) || slices.Contains(suites, tls.TLS_AES_256_GCM_SHA384) {
		return true
	}
	return p.TLS12 && slices.ContainsFunc(suites, func(s uint16) bool { return slices.Contains(tls12Suites, s) })
}

// Policy is the TLS policy ztunnel takes from TLS12_ENABLED and
// COMPLIANCE_POLICY (its tls/lib.rs), which applies to HBONE and to the
// control plane alike. The zero Policy is ztunnel's default: TLS 1.3 only,
// Go's default key exchanges.
//
// FIPS 140-3 mode is not part of it: Go fixes it at process start
// (GODEBUG=fips140=on), and it then restricts every config by itself.
type Policy struct {
	// TLS12 also allows TLS 1.2, with ECDHE-ECDSA and ECDHE-RSA AES-GCM
	// suites only (tls12Suites), as ztunnel's TLS12_ENABLED.
	TLS12 bool
	// PQC restricts key exchange to X25519MLKEM768 (COMPLIANCE_POLICY=pqc),
	// so a peer that cannot do it fails the handshake, TLS 1.2 ones always.
	PQC bool
}

// minVersion is the oldest TLS version p allows.
func (p Policy) minVersion() uint16 {
	if p.TLS12 {
		return tls.VersionTLS12
	}
	return tls.VersionTLS13
}

// tls12Suites are ztunnel's TLS 1.2 suites, in its order.
var tls12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
}

// Apply sets p's versions, TLS 1.2 suites and key exchanges on c (for
// example the control plane's config) and returns c.
func (p Policy) Apply(c *tls.Config) *tls.Config {
	c.MinVersion = p.minVersion()
	if p.TLS12 {
		c.CipherSuites = slices.Clone(tls12Suites)
	}
	if p.PQC {
		c.CurvePreferences = []tls.CurveID{tls.X25519MLKEM768}
	}
	return c
}

// ServerConfig is the inbound HBONE (15008) TLS config (SPEC §2.1, §6.5):
// TLS 1.3 only, ALPN "h2" required, session tickets disabled, the
// certificate from get (called once per handshake with the handshake's
// context; an error aborts the handshake), and a client certificate
// required. The client chain must be an X.509-SVID (x509svid.Verify) that
// verifies to the server cert's roots for client auth: the client leaf must
// not be a CA and must carry exactly one URI SAN, which must be a valid
// SPIFFE workload identity (PeerIdentity) whose trust domain equals the
// server cert's trust domain. Any SAN with a NUL or other control byte
// fails the handshake. If the server cert carries a CRL (Cert.WithCRL), a
// client chain it revokes fails with ErrCertRevoked.
func ServerConfig(get func(ctx context.Context) (*Cert, error)) *tls.Config {
	return Policy{}.ServerConfig(get)
}

// ServerConfig is the package's ServerConfig under p.
func (p Policy) ServerConfig(get func(ctx context.Context) (*Cert, error)) *tls.Config {
	if get == nil {
		panic("certs: ServerConfig: nil get")
	}
	return p.Apply(&tls.Config{
		NextProtos:             []string{alpnH2},
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAnyClientCert,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if !p.offersAESGCM(hello.CipherSuites) {
				return nil, ErrCipherSuite
			}
			c, err := get(hello.Context())
			if err != nil {
				return nil, fmt.Errorf("certs: server certificate: %w", err)
			}
			return p.serverConfigFor(c), nil
		},
	})
}

// serverConfigFor is the per-handshake config that serves c and verifies
// the client against c's roots and trust domain.
func (p Policy) serverConfigFor(c *Cert) *tls.Config {
	return p.Apply(&tls.Config{
		NextProtos:             []string{alpnH2},
		SessionTicketsDisabled: true,
		Certificates:           []tls.Certificate{*c.TLSCertificate()},
		ClientAuth:             tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyClient(c, p, &cs, time.Now())
		},
	})
}

// ClientConfig is the outbound HBONE TLS config (SPEC §2.1, §6.5): TLS 1.3
// only, ALPN "h2" required, no SNI (ServerName empty; use tls.Client, since
// tls.Dial fills ServerName from the address), no session resumption, and
// client certificate c. The server chain must verify to c's roots for
// server auth, the server leaf must not be a CA, and at least one URI SAN
// of the server leaf must exactly equal one entry of expectedSANs (SPIFFE
// URI strings such as "spiffe://cluster.local/ns/a/sa/b"). DNS and IP SANs
// are ignored. An empty expectedSANs matches no server. If c carries a CRL
// (Cert.WithCRL), a server chain it revokes fails with ErrCertRevoked.
func ClientConfig(c *Cert, expectedSANs []string) *tls.Config {
	return Policy{}.ClientConfig(c, expectedSANs)
}

// ClientConfig is the package's ClientConfig under p.
func (p Policy) ClientConfig(c *Cert, expectedSANs []string) *tls.Config {
	if c == nil {
		panic("certs: ClientConfig: nil Cert")
	}
	want := slices.Clone(expectedSANs)
	return p.Apply(&tls.Config{
		NextProtos:         []string{alpnH2},
		Certificates:       []tls.Certificate{*c.TLSCertificate()},
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(c, p, want, &cs, time.Now())
		},
	})
}
