// Package logscope filters gozt's logs by scope the way ztunnel's RUST_LOG
// filters its targets (SPEC §0.3): Istio's chart sets RUST_LOG from its
// `logLevel` value, e.g. `info`, `debug`, `info,access=debug` or `off`.
//
// gozt's loggers carry a "scope" attribute (proxy, access, xds, certs,
// connmgr, inpod); a RUST_LOG directive `target=level` applies to the scope
// named by the target's first path element after an optional `ztunnel::`
// (`access`, `xds`, `ztunnel::proxy::inbound` → proxy). A bare level is the
// default for every other scope. Only cmd/gozt imports it.
package logscope

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// LevelOff is above every level gozt logs at: `off` silences a scope.
const LevelOff = slog.Level(100)

// Filter is a parsed RUST_LOG: a default level (if Default is set) and
// per-scope levels.
type Filter struct {
	Default    *slog.Level
	ScopeLevel map[string]slog.Level
}

// Parse reads a RUST_LOG value. An unknown level or an empty target is an
// error naming the directive.
func Parse(v string) (Filter, error) {
	f := Filter{ScopeLevel: map[string]slog.Level{}}
	for _, d := range strings.Split(v, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		target, lvl, scoped := strings.Cut(d, "=")
		if !scoped {
			lvl, target = target, ""
		}
		l, err := parseLevel(lvl)
		if err != nil {
			return Filter{}, fmt.Errorf("RUST_LOG: directive %q: %w", d, err)
		}
		if !scoped {
			f.Default = &l
			continue
		}
		scope := scopeOf(target)
		if scope == "" {
			return Filter{}, fmt.Errorf("RUST_LOG: directive %q: empty target", d)
		}
		f.ScopeLevel[scope] = l
	}
	return f, nil
}

// scopeOf maps a ztunnel target to a gozt scope.
func scopeOf(target string) string {
	target = strings.TrimPrefix(strings.TrimSpace(target), "ztunnel::")
	first, _, _ := strings.Cut(target, "::")
	return first
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "trace", "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	case "off":
		return LevelOff, nil
	}
	return 0, fmt.Errorf("unknown level %q (want trace, debug, info, warn, error or off)", s)
}

// Handler returns a handler that passes a record on to inner when its level
// reaches its logger's scope level, or else def's level. def stays live: the
// admin port's /logging changes it at runtime.
func Handler(inner slog.Handler, def *slog.LevelVar, f Filter) slog.Handler {
	return &handler{inner: inner, def: def, levels: f.ScopeLevel}
}

type handler struct {
	inner  slog.Handler
	def    *slog.LevelVar
	levels map[string]slog.Level // read-only after Handler
	level  *slog.Level           // this logger's scope level, if RUST_LOG names its scope
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool {
	if h.level != nil {
		return l >= *h.level
	}
	return l >= h.def.Level()
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error { return h.inner.Handle(ctx, r) }

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.inner = h.inner.WithAttrs(attrs)
	for _, a := range attrs {
		if a.Key != "scope" {
			continue
		}
		if l, ok := h.levels[a.Value.String()]; ok {
			next.level = &l
		}
	}
	return &next
}

func (h *handler) WithGroup(name string) slog.Handler {
	next := *h
	next.inner = h.inner.WithGroup(name)
	return &next
}
