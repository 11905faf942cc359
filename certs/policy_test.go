package certs_test

import (
	"crypto/tls"
	"slices"
	"testing"

	"github.com/gozt/gozt/certs"
)

// TestPolicyTLS12: by default HBONE is TLS 1.3 only both ways, as ztunnel;
// Policy.TLS12 (TLS12_ENABLED) admits a TLS 1.2 peer, with ztunnel's ECDHE
// AES-GCM suites only.
func TestPolicyTLS12(t *testing.T) {
	ca := newCA(t)
	srvCert, cliCert := issue(t, ca, idA), issue(t, ca, idB)
	tls12Only := func(c *tls.Config) *tls.Config {
		c.MaxVersion = tls.VersionTLS12
		if inner := c.GetConfigForClient; inner != nil {
			// Our server answers with a per-handshake config.
			c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
				cc, err := inner(h)
				if cc != nil {
					cc.MaxVersion = tls.VersionTLS12
				}
				return cc, err
			}
		}
		return c
	}
	ztunnelSuites := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	}
	for _, tc := range []struct {
		name   string
		p      certs.Policy
		wantOK bool
	}{
		{"default", certs.Policy{}, false},
		{"TLS12", certs.Policy{TLS12: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Our server, a TLS 1.2-only client (of our own, also under p).
			srv := tc.p.ServerConfig(serveCert(srvCert))
			cli := tls12Only(certs.Policy{TLS12: true}.ClientConfig(cliCert, []string{idA.String()}))
			r := handshake(t, t.Context(), srv, cli)
			if ok := r.serverErr == nil && r.clientErr == nil; ok != tc.wantOK {
				t.Fatalf("TLS 1.2 client to %s server: server %v, client %v; want success %v", tc.name, r.serverErr, r.clientErr, tc.wantOK)
			}
			if tc.wantOK && (r.serverState.Version != tls.VersionTLS12 || !slices.Contains(ztunnelSuites, r.serverState.CipherSuite)) {
				t.Errorf("negotiated %#x %s, want TLS 1.2 with one of ztunnel's suites", r.serverState.Version, tls.CipherSuiteName(r.serverState.CipherSuite))
			}
			// Our client, a TLS 1.2-only server.
			srv = tls12Only(certs.Policy{TLS12: true}.ServerConfig(serveCert(srvCert)))
			cli = tc.p.ClientConfig(cliCert, []string{idA.String()})
			r = handshake(t, t.Context(), srv, cli)
			if ok := r.serverErr == nil && r.clientErr == nil; ok != tc.wantOK {
				t.Errorf("%s client to TLS 1.2 server: server %v, client %v; want success %v", tc.name, r.serverErr, r.clientErr, tc.wantOK)
			}
			// TLS 1.3 works either way.
			r = handshake(t, t.Context(), tc.p.ServerConfig(serveCert(srvCert)), tc.p.ClientConfig(cliCert, []string{idA.String()}))
			if r.serverErr != nil || r.clientErr != nil || r.clientState.Version != tls.VersionTLS13 {
				t.Errorf("TLS 1.3: server %v, client %v, version %#x", r.serverErr, r.clientErr, r.clientState.Version)
			}
		})
	}
}

// TestPolicyPQC: Policy.PQC (COMPLIANCE_POLICY=pqc) restricts key exchange
// to X25519MLKEM768 on both sides, as ztunnel: a peer limited to X25519
// fails, and two PQC peers agree on X25519MLKEM768.
func TestPolicyPQC(t *testing.T) {
	ca := newCA(t)
	srvCert, cliCert := issue(t, ca, idA), issue(t, ca, idB)
	pqc := certs.Policy{PQC: true}
	classic := func(c *tls.Config) *tls.Config { c.CurvePreferences = []tls.CurveID{tls.X25519}; return c }
	sans := []string{idA.String()}

	r := handshake(t, t.Context(), pqc.ServerConfig(serveCert(srvCert)), pqc.ClientConfig(cliCert, sans))
	if r.serverErr != nil || r.clientErr != nil || r.serverState.CurveID != tls.X25519MLKEM768 {
		t.Errorf("PQC both sides: server %v, client %v, key exchange %v; want X25519MLKEM768", r.serverErr, r.clientErr, r.serverState.CurveID)
	}
	r = handshake(t, t.Context(), pqc.ServerConfig(serveCert(srvCert)), classic(certs.ClientConfig(cliCert, sans)))
	if r.serverErr == nil || r.clientErr == nil {
		t.Errorf("PQC server, X25519-only client: server %v, client %v; want both to fail", r.serverErr, r.clientErr)
	}
	// Our PQC client against an X25519-only server; the server's
	// GetConfigForClient answers with the per-handshake config, so restrict
	// that one.
	srv := certs.ServerConfig(serveCert(srvCert))
	inner := srv.GetConfigForClient
	srv.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := inner(h)
		if c != nil {
			classic(c)
		}
		return c, err
	}
	r = handshake(t, t.Context(), srv, pqc.ClientConfig(cliCert, sans))
	if r.clientErr == nil {
		t.Errorf("PQC client, X25519-only server: client succeeded with %v, want failure", r.clientState.CurveID)
	}
	// Without the policy Go's default still prefers the hybrid.
	r = handshake(t, t.Context(), certs.ServerConfig(serveCert(srvCert)), classic(certs.ClientConfig(cliCert, sans)))
	if r.serverErr != nil || r.clientErr != nil || r.serverState.CurveID != tls.X25519 {
		t.Errorf("default server, X25519-only client: server %v, client %v, key exchange %v", r.serverErr, r.clientErr, r.serverState.CurveID)
	}
}

// TestPolicyApply: the control plane's config gets the same versions and
// key exchanges (ztunnel's control_plane_client_config uses the same
// provider and versions).
func TestPolicyApply(t *testing.T) {
	for _, tc := range []struct {
		p        certs.Policy
		min      uint16
		suites   int
		curveIDs []tls.CurveID
	}{
		{certs.Policy{}, tls.VersionTLS13, 0, nil},
		{certs.Policy{TLS12: true}, tls.VersionTLS12, 4, nil},
		{certs.Policy{PQC: true}, tls.VersionTLS13, 0, []tls.CurveID{tls.X25519MLKEM768}},
	} {
		c := tc.p.Apply(&tls.Config{MinVersion: tls.VersionTLS10})
		if c.MinVersion != tc.min || len(c.CipherSuites) != tc.suites || !slices.Equal(c.CurvePreferences, tc.curveIDs) {
			t.Errorf("%+v.Apply: MinVersion %#x, %d suites, curves %v; want %#x, %d, %v", tc.p, c.MinVersion, len(c.CipherSuites), c.CurvePreferences, tc.min, tc.suites, tc.curveIDs)
		}
	}
}
