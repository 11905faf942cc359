// Package jsonshape lists the shape of a JSON document: every key path with
// its JSON type, without values, so a golden file of it changes only when
// names, casing or nesting change. The config dump tests of gozt local and
// gozt proxy use it against what istioctl ztunnel-config reads. Only
// tests import it.
package jsonshape

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Paths decodes doc and returns its sorted "path type" lines, arrays
// written [] and the objects at a path ending in one of dataKeyed (maps
// keyed by names or addresses, not fields) collapsed to {}.
func Paths(doc []byte, dataKeyed ...string) ([]string, error) {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	keyed := func(path string) bool {
		for _, s := range dataKeyed {
			if strings.HasSuffix(path, s) {
				return true
			}
		}
		return false
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			set[path+" object"] = true
			for k, e := range x {
				if keyed(path) {
					k = "{}"
				}
				walk(path+"."+k, e)
			}
		case []any:
			set[path+" array"] = true
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			set[path+" string"] = true
		case float64:
			set[path+" number"] = true
		case bool:
			set[path+" bool"] = true
		case nil:
			set[path+" null"] = true
		default:
			panic(fmt.Sprintf("jsonshape: %T", v))
		}
	}
	walk("", v)
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// Check fails t unless the shape of doc equals the golden file's lines;
// GOZT_UPDATE_GOLDEN=1 rewrites the file first.
func Check(t testing.TB, doc []byte, golden string, dataKeyed ...string) {
	t.Helper()
	paths, err := Paths(doc, dataKeyed...)
	if err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if os.Getenv("GOZT_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(strings.Join(paths, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (GOZT_UPDATE_GOLDEN=1 writes it)", err)
	}
	if d := Diff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), paths); d != "" {
		t.Errorf("shape changed (GOZT_UPDATE_GOLDEN=1 rewrites %s):\n%s", golden, d)
	}
}

// Diff shows the lines only in want (-) and only in got (+).
func Diff(want, got []string) string {
	var b strings.Builder
	for _, l := range want {
		if !slices.Contains(got, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
