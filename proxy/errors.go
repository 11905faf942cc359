package proxy

import "errors"

// Connection failures, by where they happen. Inbound HBONE failures carry
// their HTTP status in inboundError.
var (
	errSelfCall          = errors.New("destination is one of the proxy's own ports")
	errUnknownSource     = errors.New("source workload not found")
	errNotConnect        = errors.New("method is not CONNECT")
	errIPMismatch        = errors.New("ip mismatch: authority is not the address the connection reached")
	errNoLocalWorkload   = errors.New("local workload not found")
	errNoService         = errors.New("no service for hostname authority")
	errNoTargetPort      = errors.New("no target port for service")
	errDenied            = errors.New("connection denied by authorization policy")
	errNoHealthyUpstream = errors.New("no healthy upstream")
	errUnknownWaypoint   = errors.New("unknown waypoint")
	errDoubleHBONE       = errors.New("double HBONE (multi-network) is not supported yet")
	errProxyTunnel       = errors.New("PROXY protocol application tunnel is not supported yet")
	errSOCKS             = errors.New("socks5 protocol violation")
)
