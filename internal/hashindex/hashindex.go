// Package hashindex maps strings to int32 positions (a slot, an entry) with
// a main table keyed by a 64-bit hash of the string, so that the table
// holds no pointer and a garbage collection skips it. The caller keeps the
// strings (a workload's uid, a resource's name) where the positions point
// and says how to compare and read them back, which is how a lookup tells a
// match from a hash collision.
//
// A hash that two keys have shared maps to -1 in the main table, and the
// positions of the keys with that hash are kept by key in a small second
// map. A hash stays at -1 when removals leave fewer than two keys with it:
// the second map still answers for them, and 64-bit collisions are too rare
// for such entries to add up.
package hashindex

import "maps"

// Index is a string → int32 index. The zero value is not usable; see New.
//
// Clone makes a copy that shares the collision map until the copy first
// changes it, so a copy-on-write owner (a store's snapshots) can clone an
// index per batch and keep every published one unchanged; the source must
// not change after it has been cloned.
type Index struct {
	hash      func(string) uint64
	one       map[uint64]int32
	shared    map[string]int32
	ownShared bool // shared may be modified: it is not shared with a clone's source
}

// New returns an empty index keyed by hash.
func New(hash func(string) uint64) Index {
	return Index{hash: hash, one: map[uint64]int32{}, shared: map[string]int32{}, ownShared: true}
}

// Clone returns a copy of x with room for extra more keys, which x's
// owner may change without changing x. A small extra (under an eighth of
// the keys) is left to the map's own growth, since copying entry by entry
// is slower than maps.Clone's copy of the whole table.
func (x Index) Clone(extra int) Index {
	if extra <= len(x.one)/8 {
		x.one = maps.Clone(x.one)
	} else {
		one := make(map[uint64]int32, len(x.one)+extra)
		maps.Copy(one, x.one)
		x.one = one
	}
	x.ownShared = false
	return x
}

// Get returns key's position; false if it has none. holds reports whether
// the key stored at a position is key (so that the owner can compare
// without building a string).
func (x *Index) Get(key string, holds func(pos int32, key string) bool) (int32, bool) {
	i, ok := x.one[x.hash(key)]
	switch {
	case !ok:
		return 0, false
	case i < 0:
		i, ok = x.shared[key]
		return i, ok
	}
	return i, holds(i, key)
}

// Add indexes key, which the index must not hold, at position i. keyAt
// returns the key stored at a position already indexed.
func (x *Index) Add(key string, i int32, keyAt func(int32) string) {
	h := x.hash(key)
	cur, ok := x.one[h]
	if !ok {
		x.one[h] = i
		return
	}
	shared := x.ownedShared()
	if cur >= 0 { // the first collision on h: its key moves to shared
		shared[keyAt(cur)] = cur
		x.one[h] = -1
	}
	shared[key] = i
}

// Delete removes key, which the index must hold.
func (x *Index) Delete(key string) {
	h := x.hash(key)
	if x.one[h] >= 0 {
		delete(x.one, h)
		return
	}
	delete(x.ownedShared(), key)
}

func (x *Index) ownedShared() map[string]int32 {
	if !x.ownShared {
		x.shared = maps.Clone(x.shared)
		x.ownShared = true
	}
	return x.shared
}

// Len returns the number of keys indexed, counting them (for checks).
func (x *Index) Len() int {
	n := len(x.shared)
	for _, i := range x.one {
		if i >= 0 {
			n++
		}
	}
	return n
}
