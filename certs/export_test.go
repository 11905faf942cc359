package certs

import "log/slog"

// VerifyClientForTest and VerifyServerForTest are the inbound and outbound
// peer checks that VerifyConnection runs once per handshake.
var (
	VerifyClientForTest = verifyClient
	VerifyServerForTest = verifyServer
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
