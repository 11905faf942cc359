package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gozt/gozt/internal/gctest"
)

// version returns name's version; false if name is not held. Only tests
// read one version (the client sends them all, through All).
func (t *versionTable) version(name string) (string, bool) {
	i, ok := t.find(name)
	if !ok {
		return "", false
	}
	return t.str(t.ents[i].version), true
}

// TestVersionTableModel drives a versionTable with random sets (new names,
// new and repeated versions), removals and grows, and checks it against a
// map after every step. Names are long enough that removals make the table
// rebuild its buffer many times; one run makes every name collide in one of
// three hashes.
func TestVersionTableModel(t *testing.T) {
	t.Run("hashes", versionTableModel)
	orig := versionHash
	t.Cleanup(func() { versionHash = orig })
	versionHash = func(name string) uint64 { return uint64(len(name) % 3) }
	t.Run("colliding names", versionTableModel)
}

func versionTableModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 2026))
	var names []string
	for i := range 200 {
		names = append(names, fmt.Sprintf("Kubernetes//Pod/ns/%s-%d", strings.Repeat("x", rng.IntN(2000)), i))
	}
	names = append(names, "")
	versions := []string{"", "v1", "v2", "2026-12-02T16:00:00Z/abc"}
	tab, m := newVersionTable(), map[string]string{}
	rebuilt, size := 0, 0
	for step := range 20_000 {
		name := names[rng.IntN(len(names))]
		switch r := rng.IntN(10); {
		case r < 4:
			tab.Delete(name)
			delete(m, name)
		case r == 4:
			tab.Grow(rng.IntN(50), rng.IntN(4096))
		default:
			v := versions[rng.IntN(len(versions))]
			tab.Set(name, v)
			m[name] = v
		}
		if len(tab.buf) < size {
			rebuilt++
		}
		size = len(tab.buf)
		if tab.Len() != len(m) {
			t.Fatalf("step %d: Len %d, want %d", step, tab.Len(), len(m))
		}
		for _, n := range []string{name, names[rng.IntN(len(names))]} {
			v, ok := tab.version(n)
			if want, wantOK := m[n]; ok != wantOK || v != want || tab.Has(n) != wantOK {
				t.Fatalf("step %d: Version(%.40q) = %q, %v; want %q, %v", step, n, v, ok, want, wantOK)
			}
		}
		if step%500 == 0 {
			if got := maps.Collect(tab.All()); !maps.Equal(got, m) {
				t.Fatalf("step %d: All lists %d names, want %d", step, len(got), len(m))
			}
		}
	}
	if got := maps.Collect(tab.All()); !maps.Equal(got, m) {
		t.Fatalf("All lists %d names, want %d", len(got), len(m))
	}
	if rebuilt == 0 {
		t.Fatal("the buffer was never rebuilt: the test does not reach maybeCompact")
	}
	if len(tab.buf) > 2*compactMin && tab.unused > len(tab.buf)/2 {
		t.Fatalf("%d of %d bytes unused", tab.unused, len(tab.buf))
	}
}

// TestVersionTableSharesVersions checks that names set in a row with one
// version store it once.
func TestVersionTableSharesVersions(t *testing.T) {
	tab := newVersionTable()
	v := strings.Repeat("v", 100)
	for i := range 1000 {
		tab.Set(fmt.Sprintf("n%04d", i), v)
	}
	if n := len(tab.buf); n != 1000*5+100 {
		t.Fatalf("buffer of %d bytes, want %d (each name once, the version once)", n, 1000*5+100)
	}
}

// BenchmarkVersionTableMark100k measures what 100,000 held names cost a
// collection, against the map[string]string the client kept before.
func BenchmarkVersionTableMark100k(b *testing.B) {
	names := make([]string, 100_000)
	for i := range names {
		names[i] = fmt.Sprintf("Kubernetes//Pod/ns%d/pod-%d", i%50, i)
	}
	b.Run("table", func(b *testing.B) {
		tab := newVersionTable()
		for _, n := range names {
			tab.Set(n, "v1")
		}
		gctest.ReportMarkCPU(b, tab)
	})
	b.Run("map", func(b *testing.B) {
		m := make(map[string]string, len(names))
		for _, n := range names {
			m[n] = "v1"
		}
		gctest.ReportMarkCPU(b, m)
	})
}
