package logscope

import (
	"bytes"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	debug, info, off := slog.LevelDebug, slog.LevelInfo, LevelOff
	for _, tc := range []struct {
		in      string
		def     *slog.Level
		scopes  map[string]slog.Level
		wantErr string
	}{
		{in: "", scopes: map[string]slog.Level{}},
		{in: "info", def: &info, scopes: map[string]slog.Level{}},
		{in: "debug", def: &debug, scopes: map[string]slog.Level{}},
		{in: "off", def: &off, scopes: map[string]slog.Level{}},
		{in: "info,access=debug", def: &info, scopes: map[string]slog.Level{"access": debug}},
		{in: "ztunnel::proxy::inbound=trace, xds=off", scopes: map[string]slog.Level{"proxy": debug, "xds": off}},
		{in: "hickory_server::server=off,warn", def: ptr(slog.LevelWarn), scopes: map[string]slog.Level{"hickory_server": off}},
		{in: "loud", wantErr: `directive "loud": unknown level`},
		{in: "access=verbose", wantErr: `directive "access=verbose"`},
		{in: "=debug", wantErr: "empty target"},
	} {
		f, err := Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "RUST_LOG: ") {
				t.Errorf("Parse(%q) error = %v, want one naming RUST_LOG and %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if (f.Default == nil) != (tc.def == nil) || (f.Default != nil && *f.Default != *tc.def) {
			t.Errorf("Parse(%q) default = %v, want %v", tc.in, f.Default, tc.def)
		}
		if len(f.ScopeLevel) != len(tc.scopes) {
			t.Errorf("Parse(%q) scopes = %v, want %v", tc.in, f.ScopeLevel, tc.scopes)
		}
		for k, v := range tc.scopes {
			if f.ScopeLevel[k] != v {
				t.Errorf("Parse(%q) scope %s = %v, want %v", tc.in, k, f.ScopeLevel[k], v)
			}
		}
	}
}

func ptr(l slog.Level) *slog.Level { return &l }

// TestHandler: a scope the filter names uses its level; other scopes use the
// default; both stay changeable at runtime.
func TestHandler(t *testing.T) {
	f, err := Parse("info,access=debug,xds=off")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	levels := NewLevels(f)
	log := slog.New(Handler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), levels))
	access, proxy, xds := log.With("scope", "access"), log.With("scope", "proxy"), log.With("scope", "xds")
	access.Debug("access-debug")
	proxy.Debug("proxy-debug")
	proxy.Info("proxy-info")
	xds.Error("xds-error")
	log.WithGroup("g").With("scope", "access").Debug("grouped-access-debug")
	if err := levels.Set("debug", false); err != nil { // POST /logging?level=debug
		t.Fatal(err)
	}
	proxy.Debug("proxy-debug-later")
	xds.Error("xds-still-off")
	if err := levels.Set("xds:error", false); err != nil { // istioctl's form
		t.Fatal(err)
	}
	xds.Error("xds-error-later")
	if err := levels.Set("", true); err != nil {
		t.Fatal(err)
	}
	proxy.Debug("proxy-debug-after-reset")
	out := buf.String()
	for _, want := range []string{"access-debug", "proxy-info", "grouped-access-debug", "proxy-debug-later", "xds-error-later"} {
		if !strings.Contains(out, "msg="+want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	for _, not := range []string{"msg=proxy-debug ", "msg=xds-error ", "xds-still-off", "proxy-debug-after-reset"} {
		if strings.Contains(out+" ", not) {
			t.Errorf("%q logged, want it filtered:\n%s", not, out)
		}
	}
}

// TestLevelsSet: each change applies on top of the current levels, or of
// the start-up ones with reset, and a bad one changes nothing.
func TestLevelsSet(t *testing.T) {
	start, err := Parse("warn,xds=error")
	if err != nil {
		t.Fatal(err)
	}
	levels := NewLevels(start)
	for _, tc := range []struct {
		set     string
		reset   bool
		want    string
		wantErr string
	}{
		{want: "xds=error,warn"},
		{set: "debug", want: "xds=error,debug"},
		{set: "access=debug,info", want: "access=debug,xds=error,info"},
		{set: "access:warning", want: "access=warn,xds=error,info"},
		{set: "ztunnel::proxy::inbound:trace", want: "access=warn,proxy=debug,xds=error,info"},
		{set: "off", want: "access=warn,proxy=debug,xds=error,off"},
		{set: "loud", want: "access=warn,proxy=debug,xds=error,off", wantErr: `directive "loud": unknown level`},
		{set: "access=debug,=info", want: "access=warn,proxy=debug,xds=error,off", wantErr: "empty target"},
		{set: "ztunnel::proxy", want: "access=warn,proxy=debug,xds=error,off", wantErr: "unknown level"},
		{reset: true, want: "xds=error,warn"},
		{set: "info", reset: true, want: "xds=error,info"},
		{set: "xds=debug", reset: true, want: "xds=debug,warn"},
	} {
		if tc.set != "" || tc.reset {
			err := levels.Set(tc.set, tc.reset)
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Set(%q, %v) error = %v, want %q", tc.set, tc.reset, err, tc.wantErr)
			}
		}
		if got := levels.String(); got != tc.want {
			t.Errorf("after Set(%q, %v): %q, want %q", tc.set, tc.reset, got, tc.want)
		}
	}
}

// TestLevelsSetUnknownScope: a scope gozt has no logger for is refused, so
// that POST /logging cannot grow the levels by one entry per name it
// makes up; scopes RUST_LOG named at start-up stay settable, as they
// were.
func TestLevelsSetUnknownScope(t *testing.T) {
	start, err := Parse("info,hickory_server::server=off")
	if err != nil {
		t.Fatal(err)
	}
	levels := NewLevels(start)
	for i := range 1000 {
		d := fmt.Sprintf("made-up-%d=debug", i)
		if err := levels.Set(d, false); err == nil || !strings.Contains(err.Error(), "unknown scope") {
			t.Fatalf("Set(%q) = %v, want an unknown-scope error", d, err)
		}
	}
	if err := levels.Set("access=debug,nosuch::thing=debug", false); err == nil {
		t.Error("Set with one known and one unknown scope succeeded, want it refused whole")
	}
	if n := len(levels.cur.Load().scopes); n != 1 {
		t.Errorf("levels hold %d scopes after refused changes, want 1 (hickory_server): %s", n, levels)
	}
	for _, d := range []string{"hickory_server=warn", "ztunnel::inpod=debug", "admission:error", "crl=warn"} {
		if err := levels.Set(d, false); err != nil {
			t.Errorf("Set(%q) = %v, want it applied", d, err)
		}
	}
	if got, want := levels.String(), "admission=error,crl=warn,hickory_server=warn,inpod=debug,info"; got != want {
		t.Errorf("levels = %q, want %q", got, want)
	}
}

// TestScopesNameEveryLogger: every "scope" attribute cmd/gozt gives a
// logger is one of Scopes, so /logging can change its level.
func TestScopesNameEveryLogger(t *testing.T) {
	re := regexp.MustCompile(`"scope",\s*"([^"]*)"`)
	seen := map[string]bool{}
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			seen[m[1]] = true
			if !slices.Contains(Scopes(), m[1]) {
				t.Errorf("%s logs with scope %q, which Scopes lacks: /logging would refuse it", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 5 {
		t.Fatalf("found only scopes %v in cmd/gozt: the scan is broken", seen)
	}
}
