// Package gozt_test holds repository-wide checks: import rules and package docs.
package gozt_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// TestPackageDocs fails when a package has no doc comment (STYLE.md rule 41).
func TestPackageDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Doc,Name", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct{ ImportPath, Doc, Name string }
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if p.Doc == "" {
			t.Errorf("package %s has no package doc comment", p.ImportPath)
		}
	}
}
