package logscope

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
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
	prefix string // group path, "g." per open group
	pre    []byte // attrs formatted once, for plain
	preJS  []byte // attrs formatted once, for json: `,"key":value` each
}

func (h *formatHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *formatHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *h
	next.pre = append([]byte(nil), h.pre...)
	next.preJS = append([]byte(nil), h.preJS...)
	for _, a := range attrs {
		if a.Key == "scope" && h.prefix == "" {
			next.scope = a.Value.String()
			continue
		}
		next.pre = appendPlainAttr(next.pre, h.prefix, a)
		next.preJS = flattenAttr(next.preJS, h.prefix, a, appendJSONMember)
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
	bp := lineBufs.Get().(*[]byte)
	var b []byte
	if h.json {
		b = h.formatJSON((*bp)[:0], r)
	} else {
		b = h.formatPlain((*bp)[:0], r)
	}
	err := h.out.write(b)
	if cap(b) <= maxPooledLine {
		*bp = b
		lineBufs.Put(bp)
	}
	return err
}

// lineBufs holds the buffers lines are formatted in: an access line per
// connection per proxy (SPEC §7.3) would otherwise allocate and grow one
// each time (BenchmarkAccessLine). A buffer that a very long line grew
// past maxPooledLine is left to the collector.
var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooledLine = 16 << 10

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

// formatPlain appends r's line to b.
func (h *formatHandler) formatPlain(b []byte, r slog.Record) []byte {
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
	if out, ok := appendAddr(b, v.Any(), true); ok {
		return out
	}
	switch x := v.Any().(type) {
	case error:
		return appendDebugQuoted(b, x.Error())
	case fmt.Stringer:
		return append(b, x.String()...)
	}
	return appendDebugQuoted(b, fmt.Sprint(v.Any()))
}

// appendAddr appends v as its String method would if it is a valid
// netip.AddrPort or netip.Addr (an access line has two or three), without
// the string, and reports whether it did; one with a zone only if zoned.
func appendAddr(b []byte, v any, zoned bool) ([]byte, bool) {
	switch x := v.(type) {
	case netip.AddrPort:
		if x.IsValid() && (zoned || x.Addr().Zone() == "") {
			return x.AppendTo(b), true
		}
	case netip.Addr:
		if x.IsValid() && (zoned || x.Zone() == "") {
			return x.AppendTo(b), true
		}
	}
	return b, false
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

// formatJSON appends r's line to b.
func (h *formatHandler) formatJSON(b []byte, r slog.Record) []byte {
	b = append(b, `{"level":`...)
	b = appendJSONString(b, levelText(r.Level))
	b = append(b, `,"time":"`...)
	b = r.Time.UTC().AppendFormat(b, timeLayout) // nothing in it to escape
	b = append(b, `","scope":`...)
	b = appendJSONString(b, h.scopeName())
	b = append(b, `,"message":`...)
	b = appendJSONString(b, r.Message)
	b = append(b, h.preJS...)
	r.Attrs(func(a slog.Attr) bool {
		b = flattenAttr(b, h.prefix, a, appendJSONMember)
		return true
	})
	return append(b, "}\n"...)
}

// appendJSONMember appends `,"prefix+key":value`.
func appendJSONMember(b []byte, prefix, key string, v slog.Value) []byte {
	b = append(b, ',', '"')
	b = appendJSONStringBody(b, prefix)
	b = appendJSONStringBody(b, key)
	b = append(b, '"', ':')
	return appendJSONValue(b, v)
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
		b = append(b, '"')
		b = v.Time().UTC().AppendFormat(b, timeLayout)
		return append(b, '"')
	}
	// An address's hex digits, dots, colons and brackets need no
	// escaping; a zone might.
	if out, ok := appendAddr(append(b, '"'), v.Any(), false); ok {
		return append(out, '"')
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

// appendJSONString appends s as encoding/json's Marshal encodes a string:
// quoted, with \" \\ \b \f \n \r \t, \u00XX for other control bytes and
// for <, > and & (HTML-safe), \ufffd for invalid UTF-8, and \u2028 and
// \u2029 escaped (TestJSONStringMatchesEncodingJSON), without Marshal's
// allocations.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONStringBody(b, s)
	return append(b, '"')
}

func appendJSONStringBody(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}
