package node

import (
	"log/slog"

	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/proxy/dns"
)

// newHostResolver returns the resolver of endpoints that have a hostname
// and no IPs (SPEC §3.3), from gozt's resolv.conf whatever DNS_CAPTURE
// says, as ztunnel's on-demand resolver reads its own; A records only when
// IPV6_ENABLED is false. Without a readable resolv.conf every such lookup
// fails (ztunnel does not start then).
func newHostResolver(env envconfig.Config, resolvConf string, log *slog.Logger) *dns.HostResolver {
	cfg, err := dns.ReadHostConfig(resolvConf)
	if err != nil {
		log.Warn("on-demand dns: no upstream servers; hostname endpoints will not resolve", "error", err)
	}
	cfg.IPv4Only = !env.IPv6Enabled
	return dns.NewHostResolver(cfg)
}
