package proxy

import (
	"log/slog"

	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
)

// logAuthz logs authorization's decision d on c at debug, or at info with
// AuthzInfoLogging (AUTHZ_POLICY_INFO_LOGGING), as telemetry.LogAuthz words
// it.
func (p *Proxy) logAuthz(d rbac.Decision, c rbac.Conn) {
	level := slog.LevelDebug
	if p.cfg.AuthzInfoLogging {
		level = slog.LevelInfo
	}
	telemetry.LogAuthz(p.log, level, d, c)
}
