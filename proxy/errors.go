package proxy

import (
	"errors"

	"github.com/gozt/gozt/proxy/telemetry"
)

// flaggedError is an upstream failure with the response flag ztunnel
// records for it (SPEC §7.1).
type flaggedError struct {
	flag string
	err  error
}

func (e *flaggedError) Error() string { return e.err.Error() }
func (e *flaggedError) Unwrap() error { return e.err }

func withFlag(flag string, err error) error { return &flaggedError{flag: flag, err: err} }

// failureFlag is the response flag of a failed upstream connection: the one
// its error carries, else CONNECT.
func failureFlag(err error) string {
	if fe, ok := errors.AsType[*flaggedError](err); ok {
		return fe.flag
	}
	return telemetry.FlagConnect
}

// Connection failures, by where they happen. Inbound HBONE failures carry
// their HTTP status in inboundError.
var (
	errSelfCall              = errors.New("destination is one of the proxy's own ports")
	errUnknownSource         = errors.New("source workload not found")
	errNotConnect            = errors.New("method is not CONNECT")
	errIPMismatch            = errors.New("ip mismatch: authority is not the address the connection reached")
	errNoLocalWorkload       = errors.New("local workload not found")
	errNoService             = errors.New("no service for hostname authority")
	errNoTargetPort          = errors.New("no target port for service")
	errDenied                = errors.New("connection denied by authorization policy")
	errNoHealthyUpstream     = errors.New("no healthy upstream")
	errUnknownWaypoint       = errors.New("unknown waypoint")
	errRemoteNotService      = errors.New("workload on another network not addressed through a service")
	errNoNetworkGateway      = errors.New("no network gateway for a workload on another network")
	errUnknownNetworkGateway = errors.New("unknown network gateway")
	errNoServiceVIP          = errors.New("no VIP for the PROXY header: the hostname's service has none")
	errSOCKS                 = errors.New("socks5 protocol violation")
)
