package logscope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// record is one access-log line as proxy writes it, at a fixed time.
func record(level slog.Level, msg string, attrs ...slog.Attr) slog.Record {
	r := slog.NewRecord(time.Date(2026, 12, 1, 9, 5, 7, 123456789, time.FixedZone("x", 3600)), level, msg, 0)
	r.AddAttrs(attrs...)
	return r
}

var accessAttrs = []slog.Attr{
	slog.Any("src.addr", netip.MustParseAddrPort("10.0.0.1:43210")),
	slog.String("src.workload", "sleep"),
	slog.String("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
	slog.Any("dst.addr", netip.MustParseAddrPort("10.0.0.2:15008")),
	slog.String("direction", "outbound"),
	slog.Int64("bytes_sent", 76),
	slog.Int64("bytes_recv", 239),
	slog.String("duration", "2ms"),
}

// TestPlainFormat: ztunnel's plain line, byte for byte: tabs between
// time, level, scope, message and the fields; strings quoted, addresses
// and numbers bare.
func TestPlainFormat(t *testing.T) {
	var buf bytes.Buffer
	h := NewFormatHandler(&buf, FormatPlain).WithAttrs([]slog.Attr{slog.String("scope", "access")})
	if err := h.Handle(t.Context(), record(slog.LevelInfo, "connection complete", accessAttrs...)); err != nil {
		t.Fatal(err)
	}
	want := "2026-12-01T08:05:07.123456Z\tinfo\taccess\tconnection complete\t" +
		`src.addr=10.0.0.1:43210 src.workload="sleep" src.identity="spiffe://cluster.local/ns/default/sa/sleep" ` +
		`dst.addr=10.0.0.2:15008 direction="outbound" bytes_sent=76 bytes_recv=239 duration="2ms"` + "\n"
	if got := buf.String(); got != want {
		t.Errorf("plain line:\n got %q\nwant %q", got, want)
	}
}

func TestPlainFormatValues(t *testing.T) {
	for _, tc := range []struct {
		attr slog.Attr
		want string
	}{
		{slog.String("k", `a "b" \c`), `k="a \"b\" \\c"`},
		{slog.String("k", "tab\tnl\ncr\r"), `k="tab\tnl\ncr\r"`},
		{slog.String("k", "nul\x00esc\x1b"), `k="nul\u{0}esc\u{1b}"`},
		{slog.String("k", "ünïcode"), `k="ünïcode"`},
		{slog.Any("error", errors.New(`dial "x": refused`)), `error="dial \"x\": refused"`},
		{slog.Bool("k", true), `k=true`},
		{slog.Uint64("k", 7), `k=7`},
		{slog.Duration("k", 1500*time.Millisecond), `k=1.5s`},
		{slog.Group("g", slog.Int("a", 1), slog.String("b", "x")), `g.a=1 g.b="x"`},
		{slog.Any("k", []int{1}), `k="[1]"`},
	} {
		var buf bytes.Buffer
		h := NewFormatHandler(&buf, FormatPlain)
		if err := h.Handle(t.Context(), record(slog.LevelWarn, "m", tc.attr)); err != nil {
			t.Fatal(err)
		}
		_, fields, _ := strings.Cut(strings.TrimSuffix(buf.String(), "\n"), "\tm\t")
		if fields != tc.want {
			t.Errorf("%v: fields %q, want %q", tc.attr, fields, tc.want)
		}
		if !strings.Contains(buf.String(), "\twarn\tgozt\t") {
			t.Errorf("no level/scope in %q", buf.String())
		}
	}
}

// TestJSONFormat: level, time, scope and message first, every field by
// its name, numbers as numbers; attributes from With and groups included.
func TestJSONFormat(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewFormatHandler(&buf, FormatJSON)).With("scope", "access", "pod", "p1").WithGroup("g")
	log.LogAttrs(t.Context(), slog.LevelError, "connection complete", append(accessAttrs, slog.String("error", "boom"))...)
	line := buf.String()
	if !strings.HasPrefix(line, `{"level":"error","time":"`) || !strings.HasSuffix(line, "}\n") || strings.Count(line, "\n") != 1 {
		t.Fatalf("json line %q", line)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"level": "error", "scope": "access", "message": "connection complete", "pod": "p1",
		"g.src.addr": "10.0.0.1:43210", "g.src.workload": "sleep", "g.bytes_sent": 76.0, "g.error": "boom",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v (line %s)", k, got[k], v, line)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, got["time"].(string)); err != nil {
		t.Errorf("time %v: %v", got["time"], err)
	}
}

// TestFormatThroughLevels: the format handler under the scope filter.
func TestFormatThroughLevels(t *testing.T) {
	f, err := Parse("warn,access=info")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := NewLogger(&buf, FormatPlain, NewLevels(f))
	log.With("scope", "access").Info("connection complete", "bytes_sent", 1)
	log.With("scope", "proxy").Info("dropped")
	log.With("scope", "proxy").Warn("kept")
	out := buf.String()
	if !strings.Contains(out, "\tinfo\taccess\tconnection complete\tbytes_sent=1\n") || !strings.Contains(out, "\twarn\tproxy\tkept\t\n") || strings.Contains(out, "dropped") {
		t.Errorf("filtered output:\n%s", out)
	}
}

// TestPlainAttrNoAlloc: flattening a record's attributes costs no
// allocation of its own (the leaf is a plain function, not a closure).
func TestPlainAttrNoAlloc(t *testing.T) {
	buf := make([]byte, 0, 256)
	a := slog.String("src.addr", "10.0.0.1:80")
	if n := testing.AllocsPerRun(100, func() { buf = appendPlainAttr(buf[:0], "", a) }); n != 0 {
		t.Errorf("appendPlainAttr: %v allocations, want 0", n)
	}
	if string(buf) != `src.addr="10.0.0.1:80" ` {
		t.Errorf("appendPlainAttr wrote %q", buf)
	}
}

// TestJSONStringMatchesEncodingJSON: the JSON format's own string encoder
// writes what encoding/json's Marshal writes, for every byte, the line
// separators, invalid UTF-8 and random strings.
func TestJSONStringMatchesEncodingJSON(t *testing.T) {
	cases := []string{"", "plain", "\u2028\u2029", "a\xffb", "\xe2\x80", "<a href=\"x\">&amp;</a>", "tab\there\r\n\b\f\x00\x1f\x7f", "ünï©ødé 🎉"}
	for c := range 256 {
		cases = append(cases, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		cases = append(cases, string(b), strings.ToValidUTF8(string(b), "\u2028"))
	}
	for _, s := range cases {
		checkJSONString(t, s)
	}
}

// checkJSONString fails t unless appendJSONString writes s as
// encoding/json's Marshal does.
func checkJSONString(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendJSONString(nil, s); string(got) != string(want) {
		t.Errorf("appendJSONString(%q) = %s, want %s", s, got, want)
	}
}

// TestFormatAddresses: addresses are written as their String methods
// write them, an invalid one and a zoned one (escaped in JSON) included.
func TestFormatAddresses(t *testing.T) {
	vals := []any{
		netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("[2001:db8::1]:15008"),
		netip.MustParseAddrPort("[fe80::1%e\"th0]:80"), netip.AddrPort{},
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fe80::1%eth0"), netip.Addr{},
	}
	for _, v := range vals {
		str := v.(fmt.Stringer).String()
		var plain, js bytes.Buffer
		slog.New(NewFormatHandler(&plain, FormatPlain)).Info("m", "a", v)
		slog.New(NewFormatHandler(&js, FormatJSON)).Info("m", "a", v)
		if !strings.HasSuffix(plain.String(), "\ta="+str+"\n") {
			t.Errorf("plain %v: %q", str, plain.String())
		}
		var got map[string]any
		if err := json.Unmarshal(js.Bytes(), &got); err != nil || got["a"] != str {
			t.Errorf("json %v: %q (%v)", str, js.String(), err)
		}
	}
}

// FuzzAppendJSONString: for any string, the JSON format's encoder writes
// what encoding/json's Marshal writes.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "<&>", "\u2028", "\xff\xfe", "\x00\x1f\x7f", "é🎉"} {
		f.Add(s)
	}
	f.Fuzz(checkJSONString)
}

// TestJSONConcurrentLines: records logged at once through one logger that
// carries attributes of its own each come out whole, with their own
// values (the attributes formatted once are shared by every line, never
// written to).
func TestJSONConcurrentLines(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewFormatHandler(&buf, FormatJSON)).With("a", 1, "b", 2, "c", 3)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { log.Info("m", "n", i, "d", strconv.Itoa(i)) })
	}
	wg.Wait()
	seen := make(map[float64]bool)
	for line := range strings.SplitSeq(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		i, _ := got["n"].(float64)
		if got["a"] != 1.0 || got["b"] != 2.0 || got["c"] != 3.0 || got["d"] != strconv.Itoa(int(i)) {
			t.Errorf("line %q: not its own record's", line)
		}
		seen[i] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct records of %d", len(seen), n)
	}
}
