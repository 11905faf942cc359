package jsonshape

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPaths(t *testing.T) {
	got, err := Paths([]byte(`{"a":[{"b":1,"c":"x"},{"b":2,"d":null}],"m":{"10.0.0.1":{"port":true}},"e":[]}`), ".m")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{" object", ".a array", ".a[] object", ".a[].b number", ".a[].c string", ".a[].d null",
		".e array", ".m object", ".m.{} object", ".m.{}.port bool"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Paths (-want +got):\n%s", diff)
	}
	if d := Diff([]string{"a", "b"}, []string{"b", "c"}); d != "- a\n+ c\n" {
		t.Errorf("Diff = %q", d)
	}
	if _, err := Paths([]byte(`{`)); err == nil {
		t.Error("Paths of broken JSON: no error")
	}
}
