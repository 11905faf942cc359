package hashindex

import (
	"fmt"
	"hash/maphash"
	"maps"
	"math/rand/v2"
	"testing"
)

// TestIndexModel drives an Index with random adds and deletes against a
// map, with a real hash and with one that puts every key in one of three
// hashes, cloning it now and then and checking that a clone's source never
// changes afterwards.
func TestIndexModel(t *testing.T) {
	seed := maphash.MakeSeed()
	for name, hash := range map[string]func(string) uint64{
		"hashes":    func(k string) uint64 { return maphash.String(seed, k) },
		"colliding": func(k string) uint64 { return uint64(len(k) % 3) },
	} {
		t.Run(name, func(t *testing.T) { indexModel(t, hash) })
	}
}

func indexModel(t *testing.T, hash func(string) uint64) {
	rng := rand.New(rand.NewPCG(11, 2026))
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("c//Pod/ns/w%d", i))
	}
	// keyAt reads positions back as the owner does: position i holds keys[i].
	keyAt := func(i int32) string { return keys[i] }
	holds := func(i int32, k string) bool { return keys[i] == k }
	x, m := New(hash), map[string]int32{}
	type frozen struct {
		x Index
		m map[string]int32
	}
	var clones []frozen
	for step := range 5000 {
		i := rng.IntN(len(keys))
		k := keys[i]
		_, held := m[k]
		switch r := rng.IntN(10); {
		case r == 0:
			clones = append(clones, frozen{x, maps.Clone(m)})
			x = x.Clone(rng.IntN(20))
		case r < 5 && held:
			x.Delete(k)
			delete(m, k)
		case !held:
			x.Add(k, int32(i), keyAt)
			m[k] = int32(i)
		}
		for _, k := range []string{k, keys[rng.IntN(len(keys))], "absent"} {
			got, ok := x.Get(k, holds)
			if want, wantOK := m[k]; ok != wantOK || (ok && got != want) {
				t.Fatalf("step %d: Get(%s) = %d, %v; want %d, %v", step, k, got, ok, want, wantOK)
			}
		}
		if x.Len() != len(m) {
			t.Fatalf("step %d: Len %d, want %d", step, x.Len(), len(m))
		}
	}
	for n, c := range clones {
		for _, k := range keys {
			got, ok := c.x.Get(k, holds)
			if want, wantOK := c.m[k]; ok != wantOK || (ok && got != want) {
				t.Fatalf("clone source %d changed: Get(%s) = %d, %v; want %d, %v", n, k, got, ok, want, wantOK)
			}
		}
	}
}
