package certs

// VerifyClientForTest and VerifyServerForTest are the inbound and outbound
// peer checks that VerifyConnection runs once per handshake.
var (
	VerifyClientForTest = verifyClient
	VerifyServerForTest = verifyServer
)
