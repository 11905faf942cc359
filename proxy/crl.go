package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/telemetry"
)

// Certificate revocation (SPEC §2.1, CRL_PATH). A handshake with a peer
// whose chain a CRL revokes fails in certs, with certs.ErrCertRevoked,
// which the proxy counts and flags here. Tunnels open when a CRL change
// revokes their peer are closed abruptly by CRLChanged: every mTLS
// connection, either way, is tracked with the certificate it was made with
// and the chain its peer presented.

// tunnel is one tracked mTLS connection.
type tunnel struct {
	cert     *certs.Cert // ours, which carries the CRL and the roots
	peer     []*x509.Certificate
	at       time.Time // of the handshake: what the chain was checked against
	reporter string
	close    func()
}

// trackTunnel registers the mTLS connection key (made with cert, its peer
// having presented cs's chain), to be closed by close if a CRL revokes the
// peer later. It reports whether the current CRL revokes it already: a
// reload can land between the handshake's check and the registration.
func (p *Proxy) trackTunnel(key any, cert *certs.Cert, cs *tls.ConnectionState, reporter string, close func()) (revoked bool) {
	if cert == nil || cert.CRL() == nil {
		return false
	}
	t := &tunnel{cert: cert, peer: cs.PeerCertificates, at: time.Now(), reporter: reporter, close: close}
	p.tunnels.Store(key, t)
	return t.revoked()
}

func (t *tunnel) revoked() bool { return t.cert.CRL().PeerRevoked(t.cert, t.peer, t.at) }

// untrackTunnel forgets the connection key.
func (p *Proxy) untrackTunnel(key any) { p.tunnels.Delete(key) }

// CRLChanged re-checks every open mTLS connection against the current CRL
// and closes, abruptly, those whose peer it now revokes; it returns how
// many. Call it when CRL_PATH changes (certs.CRL.Watch).
func (p *Proxy) CRLChanged() int {
	n := 0
	p.tunnels.Range(func(key, v any) bool {
		t := v.(*tunnel)
		if t.revoked() {
			p.tunnels.Delete(key)
			p.log.Warn("closing a connection whose peer certificate is now revoked", "reporter", t.reporter,
				"peer", t.peer[0].Subject.String())
			p.cfg.Metrics.CRLRejections(t.reporter).Inc()
			t.close()
			n++
		}
		return true
	})
	return n
}

// noteHandshakeError counts a handshake the CRL refused.
func (p *Proxy) noteHandshakeError(err error, reporter string) {
	if errors.Is(err, certs.ErrCertRevoked) {
		p.cfg.Metrics.CRLRejections(reporter).Inc()
	}
}

// handshakeFlag is the response flag of a failed outbound TLS handshake.
func handshakeFlag(err error) string {
	if errors.Is(err, certs.ErrCertRevoked) {
		return telemetry.FlagRevoked
	}
	return telemetry.FlagTLS
}

// trackInbound tracks an inbound mTLS connection for CRL re-checks, with
// the certificate the handshake used (cached by the manager), and reports
// whether it may go on.
func (p *Proxy) trackInbound(tc *tls.Conn, cs *tls.ConnectionState) bool {
	ctx, cancel := context.WithTimeout(p.lifetime, handshakeTimeout)
	cert, err := p.serverCert(ctx)
	cancel()
	switch {
	case err != nil:
		p.cfg.Metrics.CRLUntracked("destination").Inc()
		return true
	case p.trackTunnel(tc, cert, cs, "destination", func() { tc.Close() }):
		p.untrackTunnel(tc)
		p.cfg.Metrics.CRLRejections("destination").Inc()
		tc.Close()
		return false
	}
	return true
}

// trackOutbound tracks a pooled mTLS connection to an HBONE peer until it
// is gone, and reports whether it may be used.
func (p *Proxy) trackOutbound(cc *hbone.ClientConn, cert *certs.Cert, cs *tls.ConnectionState) bool {
	if p.trackTunnel(cc, cert, cs, "source", func() { cc.Close() }) {
		p.untrackTunnel(cc)
		p.cfg.Metrics.CRLRejections("source").Inc()
		cc.Close()
		return false
	}
	if cert.CRL() != nil {
		go func() { // one per pooled HBONE connection, only with CRL_PATH
			<-cc.Done()
			p.untrackTunnel(cc)
		}()
	}
	return true
}
