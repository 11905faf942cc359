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
func offersAESGCM(suites []uint16) bool {
	return slices.Contains(suites, tls.TLS_AES_128_GCM_SHA256) ||
		slices.Contains(suites, tls.TLS_AES_256_GCM_SHA384)
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
