// Package logscope filters gozt's logs by scope the way ztunnel's RUST_LOG
// filters its targets (SPEC §0.3): Istio's chart sets RUST_LOG from its
// `logLevel` value, e.g. `info`, `debug`, `info,access=debug` or `off`, and
// `istioctl ztunnel-config log` changes it at run time through the admin
// port's POST /logging, which Levels serves.
//
// gozt's loggers carry a "scope" attribute (proxy, access, xds, certs,
// connmgr, inpod, dns); a directive `target=level` applies to the scope
// named by the target's first path element after an optional `ztunnel::`
// (`access`, `xds`, `ztunnel::proxy::inbound` → proxy). A bare level is the
// default for every other scope. Only cmd/gozt imports it.
package logscope

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// LevelOff is above every level gozt logs at: `off` silences a scope.
const LevelOff = slog.Level(100)

// Filter is a parsed directive list: a default level (if Default is set) and
// per-scope levels.
type Filter struct {
	Default    *slog.Level
	ScopeLevel map[string]slog.Level
}

// Parse reads a RUST_LOG value. An unknown level or an empty target is an
// error naming the directive.
func Parse(v string) (Filter, error) {
	f, err := parse(v)
	if err != nil {
		return Filter{}, fmt.Errorf("RUST_LOG: %w", err)
	}
	return f, nil
}

// parse reads comma-separated directives: `level`, `target=level`, or
// `target:level`. ztunnel's tracing filter takes only `=`, but istioctl
// ztunnel-config log --level access:debug sends the `:` form, so both are
// read alike.
func parse(v string) (Filter, error) {
	f := Filter{ScopeLevel: map[string]slog.Level{}}
	for _, d := range strings.Split(v, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		target, lvl, scoped := cutDirective(d)
		l, err := parseLevel(lvl)
		if err != nil {
			return Filter{}, fmt.Errorf("directive %q: %w", d, err)
		}
		if !scoped {
			f.Default = &l
			continue
		}
		scope := scopeOf(target)
		if scope == "" {
			return Filter{}, fmt.Errorf("directive %q: empty target", d)
		}
		f.ScopeLevel[scope] = l
	}
	return f, nil
}

// cutDirective splits `target=level` or `target:level`; a `::` is a path
// separator inside the target, never the split.
func cutDirective(d string) (target, level string, scoped bool) {
	if t, l, ok := strings.Cut(d, "="); ok {
		return t, l, true
	}
	i := strings.LastIndexByte(d, ':')
	if i < 0 || (i > 0 && d[i-1] == ':') {
		return "", d, false
	}
	return d[:i], d[i+1:], true
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
	case "error", "critical": // istioctl's name, sent as is in a scoped clause
		return slog.LevelError, nil
	case "off":
		return LevelOff, nil
	}
	return 0, fmt.Errorf("unknown level %q (want trace, debug, info, warn, error or off)", s)
}

// levelName names a filter level as /logging reports it: a record's name,
// or "off" (parseLevel never makes a level below debug).
func levelName(l slog.Level) string {
	if l >= LevelOff {
		return "off"
	}
	return levelText(l)
}

// filter is one immutable generation of the live filter.
type filter struct {
	def    slog.Level
	scopes map[string]slog.Level // never written after it is published
}

func (f *filter) level(scope string) slog.Level {
	if l, ok := f.scopes[scope]; ok {
		return l
	}
	return f.def
}

// String renders the filter as directives, scopes sorted, default last
// (the order ztunnel's "current log level is ..." reply uses).
func (f *filter) String() string {
	var b strings.Builder
	for _, s := range slices.Sorted(maps.Keys(f.scopes)) {
		fmt.Fprintf(&b, "%s=%s,", s, levelName(f.scopes[s]))
	}
	b.WriteString(levelName(f.def))
	return b.String()
}

// Levels is the live filter every gozt logger consults: the start-up one
// (RUST_LOG, then LOG_LEVEL) until POST /logging changes it. Loggers read
// it with one atomic load; changes are serialised and publish a new
// generation, so a reader never sees a half-applied change.
type Levels struct {
	mu    sync.Mutex // serialises Set
	start *filter
	cur   atomic.Pointer[filter]
}

// NewLevels returns live levels starting at f; a missing default is info.
func NewLevels(f Filter) *Levels {
	start := &filter{def: slog.LevelInfo, scopes: maps.Clone(f.ScopeLevel)}
	if start.scopes == nil {
		start.scopes = map[string]slog.Level{}
	}
	if f.Default != nil {
		start.def = *f.Default
	}
	l := &Levels{start: start}
	l.cur.Store(start)
	return l
}

// Scopes returns the scopes of gozt's loggers, sorted: the ones a
// directive given to Set may name (TestScopesNameEveryLogger keeps it in
// step with cmd/gozt).
func Scopes() []string {
	return []string{"access", "admission", "certs", "connmgr", "crl", "dns", "grpc", "inpod", "proxy", "xds"}
}

// Set applies directives on top of the current filter, or on top of the
// start-up one when reset is true, as ztunnel's /logging does: a bare
// level replaces the default, a scoped one that scope's level. Invalid
// directives change nothing.
//
// A directive may name only one of Scopes or a scope of the start-up
// filter: every scope named stays in the filter until a reset, so
// accepting any name would let POST /logging grow it without bound.
// ztunnel's /logging takes any target.
func (l *Levels) Set(directives string, reset bool) error {
	f, err := parse(directives)
	if err != nil {
		return err
	}
	for _, s := range slices.Sorted(maps.Keys(f.ScopeLevel)) {
		if _, ok := l.start.scopes[s]; !ok && !slices.Contains(Scopes(), s) {
			return fmt.Errorf("unknown scope %q (want one of %s)", s, strings.Join(Scopes(), ", "))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	base := l.cur.Load()
	if reset {
		base = l.start
	}
	next := &filter{def: base.def, scopes: maps.Clone(base.scopes)}
	if f.Default != nil {
		next.def = *f.Default
	}
	maps.Copy(next.scopes, f.ScopeLevel)
	l.cur.Store(next)
	return nil
}

// String is the current filter as directives, e.g. `access=debug,info`.
func (l *Levels) String() string { return l.cur.Load().String() }

// Enabled reports whether a record at lvl from scope ("" for none) passes.
func (l *Levels) Enabled(scope string, lvl slog.Level) bool {
	return lvl >= l.cur.Load().level(scope)
}

// NewLogger returns the logger gozt logs through: records in ztunnel's plain
// or JSON format (LOG_FORMAT, any case) on w, passed on by the live levels.
func NewLogger(w io.Writer, format string, levels *Levels) *slog.Logger {
	return slog.New(Handler(NewFormatHandler(w, strings.ToLower(format)), levels))
}

// Handler returns a handler that passes a record on to inner when its level
// reaches the live level of its logger's scope.
func Handler(inner slog.Handler, levels *Levels) slog.Handler {
	return &handler{inner: inner, levels: levels}
}

type handler struct {
	inner  slog.Handler
	levels *Levels
	scope  string // this logger's "scope" attribute, if any
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool {
	return h.levels.Enabled(h.scope, l)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error { return h.inner.Handle(ctx, r) }

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.inner = h.inner.WithAttrs(attrs)
	for _, a := range attrs {
		if a.Key == "scope" {
			next.scope = a.Value.String()
		}
	}
	return &next
}

func (h *handler) WithGroup(name string) slog.Handler {
	next := *h
	next.inner = h.inner.WithGroup(name)
	return &next
}
