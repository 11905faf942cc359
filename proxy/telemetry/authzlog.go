package telemetry

import (
	"context"
	"log/slog"

	"github.com/gozt/gozt/rbac"
)

// LogAuthz logs authorization's decision d on c to log at level, with
// ztunnel's messages for each outcome (its state.rs assert_rbac). Nothing
// is built unless the line is logged: this runs for every connection.
func LogAuthz(log *slog.Logger, level slog.Level, d rbac.Decision, c rbac.Conn) {
	ctx := context.Background()
	if !log.Enabled(ctx, level) {
		return
	}
	var msg string
	attrs := make([]slog.Attr, 0, 4)
	switch d.Reason {
	case rbac.AllowedNoPolicies:
		msg = "no allow policies, allow"
	case rbac.AllowedByPolicy:
		msg = "allow policy match"
	case rbac.DeniedByPolicy:
		msg = "deny policy match"
	case rbac.DeniedNoAllowMatched:
		msg = "no allow policies matched"
	case rbac.DeniedUnknownPolicy:
		msg = "unknown referenced policy, deny"
		attrs = append(attrs, slog.String("policy", d.Missing))
	default:
		return
	}
	if d.Policy != nil {
		attrs = append(attrs, slog.String("policy", d.Policy.Key()))
	}
	attrs = append(attrs, slog.String("src.addr", c.Src.String()), slog.String("dst.addr", c.Dst.String()))
	if !c.Identity.IsZero() {
		attrs = append(attrs, slog.String("src.identity", c.Identity.String()))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}
