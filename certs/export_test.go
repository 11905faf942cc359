package certs

import (
	"crypto/tls"
	"log/slog"
	"time"
)

// VerifyClientForTest and VerifyServerForTest are the inbound and outbound
// peer checks that VerifyConnection runs once per handshake.
var (
	VerifyClientForTest = func(c *Cert, cs *tls.ConnectionState, now time.Time) error {
		return verifyClient(c, Policy{}, cs, now)
	}
	VerifyServerForTest = func(c *Cert, want []string, cs *tls.ConnectionState, now time.Time) error {
		return verifyServer(c, Policy{}, want, cs, now)
	}
)

// PollForTest runs one of Watch's polls and reports whether it published a
// new set.
func PollForTest(l *CRL, log *slog.Logger) bool { return l.poll(log) }

// ParseCRLSetForTest parses a CRL file's content as LoadCRL does.
func ParseCRLSetForTest(data []byte) (lists, entries int, err error) {
	s, err := parseCRLSet(data)
	if err != nil {
		return 0, 0, err
	}
	return s.lists, s.entries, nil
}

// OwnTrustBuiltForTest reports whether c's own roots have been made a
// trust set (a CertPool) yet.
func OwnTrustBuiltForTest(c *Cert) bool { return c.own.set != nil }
