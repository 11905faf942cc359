package logscope

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"unicode/utf8"
)

// Formats are ztunnel's two log formats (SPEC §7.3, LOG_FORMAT):
//
//	plain: time<TAB>level<TAB>scope<TAB>message<TAB>key=value key=value...
//	json:  {"level":"info","time":"...","scope":"access","message":"...",key:value...}
//
// The time is UTC RFC 3339 with microseconds, the level lower case. In
// plain, a string value is quoted as ztunnel's Debug formatting quotes it
// (src.workload="sleep"), while a value that is a fmt.Stringer — an
// address, say — is written bare, as ztunnel writes its Display fields
// (src.addr=10.0.0.1:8080). Attributes of nested groups are named
// group.key.
const (
	FormatPlain = "plain"
	FormatJSON  = "json"
)

const timeLayout = "2006-01-02T15:04:05.000000Z"

// NewFormatHandler returns a handler writing records to w in format
// (FormatJSON, or else FormatPlain) at every level; wrap it in Handler to
// filter by scope. One write per record, serialised.
func NewFormatHandler(w io.Writer, format string) slog.Handler {
	return &formatHandler{out: &lockedWriter{w: w}, json: format == FormatJSON}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) write(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.w.Write(b)
	return err
}

type formatHandler struct {
	out    *lockedWriter
	json   bool
	scope  string
	prefix string       // group path, "g." per open group
	pre    []byte       // attrs formatted once, for plain
	fields []jsonFields // attrs formatted once, for json
}

type jsonFields = [2]string // name, encoded value

func (h *formatHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *formatHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.pre = append([]byte(nil), h.pre...)
	next.fields = append([]jsonFields(nil), h.fields...)
	for _, a := range attrs {
		if a.Key == "scope" && h.prefix == "" {
			next.scope = a.Value.String()
			continue
		}
		next.pre = appendPlainAttr(next.pre, h.prefix, a)
		next.fields = appendJSONAttr(next.fields, h.prefix, a)
	}
	return &next
}

func (h *formatHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	next := *h
	next.prefix = h.prefix + name + "."
	return &next
}

func (h *formatHandler) Handle(_ context.Context, r slog.Record) error {
	if h.json {
		return h.out.write(h.formatJSON(r))
	}
	return h.out.write(h.formatPlain(r))
}

func levelText(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "error"
	case l >= slog.LevelWarn:
		return "warn"
	case l >= slog.LevelInfo:
		return "info"
	case l >= slog.LevelDebug:
		return "debug"
	}
	return "trace"
}

func (h *formatHandler) scopeName() string {
	if h.scope == "" {
		return "gozt"
	}
	return h.scope
}

func (h *formatHandler) formatPlain(r slog.Record) []byte {
	b := make([]byte, 0, 256)
	b = r.Time.UTC().AppendFormat(b, timeLayout)
	b = append(b, '\t')
	b = append(b, levelText(r.Level)...)
	b = append(b, '\t')
	b = append(b, h.scopeName()...)
	b = append(b, '\t')
	b = append(b, r.Message...)
	b = append(b, '\t')
	b = append(b, h.pre...)
	r.Attrs(func(a slog.Attr) bool {
		b = appendPlainAttr(b, h.prefix, a)
		return true
	})
	if n := len(b); b[n-1] == ' ' {
		b = b[:n-1]
	}
	return append(b, '\n')
}

// flattenAttr hands each leaf of a to leaf with its dotted key prefix: a
// group's members one by one, an empty attribute not at all (slog's rules).
// leaf is a plain function, not a closure, so that formatting a record
// allocates nothing for it.
func flattenAttr[T any](acc T, prefix string, a slog.Attr, leaf func(T, string, string, slog.Value) T) T {
	v := a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return acc
	}
	if v.Kind() != slog.KindGroup {
		return leaf(acc, prefix, a.Key, v)
	}
	p := prefix
	if a.Key != "" {
		p += a.Key + "."
	}
	for _, m := range v.Group() {
		acc = flattenAttr(acc, p, m, leaf)
	}
	return acc
}

// appendPlainAttr appends "key=value " (a group's members one by one).
func appendPlainAttr(b []byte, prefix string, a slog.Attr) []byte {
	return flattenAttr(b, prefix, a, appendPlainLeaf)
}

func appendPlainLeaf(b []byte, prefix, key string, v slog.Value) []byte {
	b = append(b, prefix...)
	b = append(b, key...)
	b = append(b, '=')
	b = appendPlainValue(b, v)
	return append(b, ' ')
}

// appendScalar appends v if it is an integer, a float or a bool, which the
// plain and the JSON format write alike, and reports whether it did.
func appendScalar(b []byte, v slog.Value) ([]byte, bool) {
	switch v.Kind() {
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10), true
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10), true
	case slog.KindFloat64:
		return strconv.AppendFloat(b, v.Float64(), 'g', -1, 64), true
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool()), true
	}
	return b, false
}

func appendPlainValue(b []byte, v slog.Value) []byte {
	if out, ok := appendScalar(b, v); ok {
		return out
	}
	switch v.Kind() {
	case slog.KindString:
		return appendDebugQuoted(b, v.String())
	case slog.KindDuration:
		return append(b, v.Duration().String()...)
	case slog.KindTime:
		return v.Time().UTC().AppendFormat(b, timeLayout)
	}
	switch x := v.Any().(type) {
	case error:
		return appendDebugQuoted(b, x.Error())
	case fmt.Stringer:
		return append(b, x.String()...)
	}
	return appendDebugQuoted(b, fmt.Sprint(v.Any()))
}

// appendDebugQuoted quotes s as Rust's Debug does for a str: backslash
// escapes for quote, backslash, \t \r \n, \u{..} for other control
// characters; other Unicode as is.
func appendDebugQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r == '\n':
			b = append(b, `\n`...)
		case r == utf8.RuneError, r < 0x20, r == 0x7f:
			b = fmt.Appendf(b, `\u{%x}`, r)
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

func (h *formatHandler) formatJSON(r slog.Record) []byte {
	b := make([]byte, 0, 320)
	b = append(b, `{"level":`...)
	b = appendJSONString(b, levelText(r.Level))
	b = append(b, `,"time":`...)
	b = appendJSONString(b, r.Time.UTC().Format(timeLayout))
	b = append(b, `,"scope":`...)
	b = appendJSONString(b, h.scopeName())
	b = append(b, `,"message":`...)
	b = appendJSONString(b, r.Message)
	fields := h.fields
	r.Attrs(func(a slog.Attr) bool {
		fields = appendJSONAttr(fields, h.prefix, a)
		return true
	})
	for _, f := range fields {
		b = append(b, ',')
		b = appendJSONString(b, f[0])
		b = append(b, ':')
		b = append(b, f[1]...)
	}
	return append(b, "}\n"...)
}

func appendJSONAttr(fields []jsonFields, prefix string, a slog.Attr) []jsonFields {
	return flattenAttr(fields, prefix, a, appendJSONLeaf)
}

func appendJSONLeaf(fields []jsonFields, prefix, key string, v slog.Value) []jsonFields {
	return append(fields, jsonFields{prefix + key, string(appendJSONValue(nil, v))})
}

func appendJSONValue(b []byte, v slog.Value) []byte {
	if out, ok := appendScalar(b, v); ok {
		return out
	}
	switch v.Kind() {
	case slog.KindString:
		return appendJSONString(b, v.String())
	case slog.KindDuration:
		return appendJSONString(b, v.Duration().String())
	case slog.KindTime:
		return appendJSONString(b, v.Time().UTC().Format(timeLayout))
	}
	switch x := v.Any().(type) {
	case error:
		return appendJSONString(b, x.Error())
	case fmt.Stringer:
		return appendJSONString(b, x.String())
	}
	enc, err := json.Marshal(v.Any())
	if err != nil {
		return appendJSONString(b, fmt.Sprint(v.Any()))
	}
	return append(b, enc...)
}

func appendJSONString(b []byte, s string) []byte {
	enc, _ := json.Marshal(s) // a string always encodes
	return append(b, enc...)
}
