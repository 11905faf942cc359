package xds

import (
	"hash/maphash"
	"iter"

	"github.com/gozt/gozt/internal/hashindex"
)

// versionSeed seeds versionHash.
var versionSeed = maphash.MakeSeed()

// versionHash keys a versionTable's index. Tests replace it to make names
// collide.
var versionHash = func(name string) uint64 { return maphash.String(versionSeed, name) }

// versionTable maps the names of the resources of one type that the store
// holds from xDS to their versions (Client.held).
//
// It holds no pointer per resource: names and versions are bytes of one
// buffer, entries are offsets into it, and the index is keyed by a 64-bit
// hash of the name (internal/hashindex), so a garbage collection marks a
// few objects instead of a map of 100,000 string pairs (measurements:
// bench/NOTES.md, "Why versionTable holds no pointer per resource").
// Removed entries leave their bytes unused until more than half of the
// buffer is unused, and then the buffer is rebuilt.
type versionTable struct {
	idx    hashindex.Index
	ents   []versionEntry // the free ones (not used) are listed in free
	free   []int32
	buf    []byte
	unused int // bytes of buf no entry uses
}

// span is bytes of a versionTable's buf.
type span struct{ off, n uint32 }

type versionEntry struct {
	name, version span
	used          bool
}

func newVersionTable() *versionTable {
	return &versionTable{idx: hashindex.New(versionHash)}
}

func (t *versionTable) str(s span) string { return string(t.buf[s.off : s.off+s.n]) }

func (t *versionTable) is(s span, v string) bool {
	return s.n == uint32(len(v)) && string(t.buf[s.off:s.off+s.n]) == v
}

// Len returns the number of names held.
func (t *versionTable) Len() int { return len(t.ents) - len(t.free) }

// find returns name's entry; false if it has none.
func (t *versionTable) find(name string) (int32, bool) { return t.idx.Get(name, t.holdsName) }

// nameAt returns the name of entry i, in a new string.
func (t *versionTable) nameAt(i int32) string { return t.str(t.ents[i].name) }

// holdsName reports whether entry i is name's.
func (t *versionTable) holdsName(i int32, name string) bool { return t.is(t.ents[i].name, name) }

// Has reports whether name is held.
func (t *versionTable) Has(name string) bool {
	_, ok := t.find(name)
	return ok
}

// Grow makes room for n more names of size bytes with their versions.
func (t *versionTable) Grow(n, size int) {
	if len(t.buf)+size > cap(t.buf) {
		buf := make([]byte, len(t.buf), len(t.buf)+size)
		copy(buf, t.buf)
		t.buf = buf
	}
	if n <= len(t.free) {
		return
	}
	t.idx = t.idx.Clone(n)
	ents := make([]versionEntry, len(t.ents), len(t.ents)+n)
	copy(ents, t.ents)
	t.ents = ents
}

// add appends v to buf, reusing the previous entry's version when equal
// (a push often gives every resource the same version).
func (t *versionTable) add(v string, last span) span {
	if t.is(last, v) {
		return last
	}
	s := span{uint32(len(t.buf)), uint32(len(v))}
	t.buf = append(t.buf, v...)
	return s
}

// Set makes version the version of name.
func (t *versionTable) Set(name, version string) {
	if i, ok := t.find(name); ok {
		e := &t.ents[i]
		if !t.is(e.version, version) {
			t.unused += int(e.version.n)
			e.version = t.add(version, span{})
		}
		t.maybeCompact()
		return
	}
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		t.ents = append(t.ents, versionEntry{})
		i = int32(len(t.ents) - 1)
	}
	var last span
	if i > 0 {
		last = t.ents[i-1].version
	}
	nameSpan := t.add(name, span{})
	t.ents[i] = versionEntry{name: nameSpan, version: t.add(version, last), used: true}
	t.idx.Add(name, i, t.nameAt)
}

// Delete removes name, if held.
func (t *versionTable) Delete(name string) {
	i, ok := t.find(name)
	if !ok {
		return
	}
	t.idx.Delete(name)
	e := t.ents[i]
	// A version shared with the next entry is counted as unused too: the
	// count only decides when to rebuild, which recounts.
	t.unused += int(e.name.n + e.version.n)
	t.ents[i] = versionEntry{}
	t.free = append(t.free, i)
	t.maybeCompact()
}

// compactMin is the smallest buffer maybeCompact rebuilds.
const compactMin = 64 << 10

// maybeCompact rebuilds buf from the entries in use when more than half of
// it is unused.
func (t *versionTable) maybeCompact() {
	if len(t.buf) < compactMin || t.unused <= len(t.buf)/2 {
		return
	}
	old := t.buf
	t.buf = make([]byte, 0, len(old)-t.unused+len(old)/8)
	var last, lastNew span // the previous entry's version, before and after
	have := false
	for i := range t.ents {
		e := &t.ents[i]
		if !e.used {
			continue
		}
		name := e.name
		e.name = span{uint32(len(t.buf)), name.n}
		t.buf = append(t.buf, old[name.off:name.off+name.n]...)
		if v := e.version; !have || v != last {
			last, lastNew, have = v, span{uint32(len(t.buf)), v.n}, true
			t.buf = append(t.buf, old[v.off:v.off+v.n]...)
		}
		e.version = lastNew
	}
	t.unused = 0
}

// All yields each name held with its version, in no particular order. The
// strings are new.
func (t *versionTable) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for i := range t.ents {
			e := &t.ents[i]
			if e.used && !yield(t.str(e.name), t.str(e.version)) {
				return
			}
		}
	}
}
