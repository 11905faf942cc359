// Package certs holds workload certificates and the TLS configurations that
// use them for HBONE (SPEC §2.1, §6).
//
// A Cert is an immutable, validated SPIFFE workload certificate (leaf,
// intermediates, key, trust roots). A Manager caches one Cert per identity,
// fetching it from an Issuer (certs/localca locally, certs/istioca in a
// cluster) with single flight, prefetching it on request (Prefetch) and
// renewing it at half-life while Run runs. At most 8 fetches run at once;
// a caller waiting in Get goes before prefetches, which go before
// rotations (SPEC §6.3).
//
// ServerConfig and ClientConfig build the inbound (15008) and outbound HBONE
// TLS configurations: TLS 1.3, ALPN "h2", mutual authentication with the
// SPIFFE checks of SPEC §6.5 done once per handshake in VerifyConnection
// (crypto/tls's own verification is off because it checks host names, not
// SPIFFE IDs). Inbound clients are verified as X.509-SVIDs with go-spiffe's
// x509svid; outbound servers with crypto/x509, because SPEC accepts server
// leafs with several URI SANs, which x509svid refuses. PeerIdentity reads
// the verified peer identity after a handshake.
//
// Every Cert a Manager hands out verifies peers against the Manager's
// roots: the union of the root bundles the CA has answered (trust.go). When
// the CA answers with a new root, or RootsChanged says its root file
// changed, old and new roots are trusted at once and Run fetches every
// certificate again without waiting for half-life; a root the CA no longer
// answers is dropped once no leaf known to need it is valid, or
// ManagerConfig.RootGrace after, whichever is first (istio/ztunnel#1679).
//
// A CRL (LoadCRL, CRL_PATH) adds revocation checks: a Cert carrying it
// (Cert.WithCRL, or every Cert of a Manager with ManagerConfig.CRL) fails
// handshakes whose peer chain it revokes with ErrCertRevoked. CRL.Watch
// reloads the file on change and calls back so that existing tunnels can
// be re-checked with CRL.PeerRevoked (SPEC §2.1).
//
// Typical use:
//
//	m := certs.NewManager(certs.ManagerConfig{Issuer: ca, Logger: log})
//	go m.Run(ctx)
//	srv := certs.ServerConfig(func(ctx context.Context) (*certs.Cert, error) {
//		return m.Get(ctx, destinationIdentity)
//	})
//	c, err := m.Get(ctx, sourceIdentity)
//	cli := certs.ClientConfig(c, []string{"spiffe://cluster.local/ns/b/sa/b"})
//	conn := tls.Client(tcpConn, cli) // not tls.Dial: it would set SNI
package certs
