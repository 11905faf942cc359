package state

import (
	"cmp"
	"iter"
	"maps"
	"slices"
	"strings"
)

// EndpointSet is the endpoints of a service, keyed by workload uid: what the
// store builds from the workloads' Services maps. A set is immutable once
// built, and its zero value is the empty set.
//
// It holds no pointer per endpoint. Its uids are one string, each entry is
// an offset into it (entries sorted by uid, so a lookup is a binary
// search), and a port map shared by many endpoints is listed once. So a
// collection, which during a push stalls live connections, marks a handful
// of objects per service, not three pointers per endpoint as a
// map[string]Endpoint would (a uid key and an Endpoint's uid and port map).
// Measurements: bench/NOTES.md, "Why EndpointSet holds no pointer per
// endpoint".
type EndpointSet struct{ t *endpointTable }

type endpointTable struct {
	uids  string          // every entry's uid, in entry order
	ents  []endpointEntry // sorted by uid
	ports []PortMap       // the entries' port maps, each distinct one once
}

// endpointEntry is one endpoint of a set: its uid is uids[off:off+n].
type endpointEntry struct {
	off, n uint32
	ports  uint32 // index in ports
	status HealthStatus
}

// freezeEndpoints returns the set of m's endpoints (keyed by uid).
func freezeEndpoints(m map[string]Endpoint) EndpointSet {
	uids := make([]string, 0, len(m))
	size := 0
	for uid := range m {
		uids = append(uids, uid)
		size += len(uid)
	}
	slices.Sort(uids)
	var b endpointBuilder
	b.grow(len(uids), size)
	for _, uid := range uids {
		b.add(uid, m[uid])
	}
	return b.set()
}

// filter returns the set of e's endpoints that keep accepts.
func (e EndpointSet) filter(keep func(Endpoint) bool) EndpointSet {
	if e.t == nil {
		return e
	}
	var b endpointBuilder
	b.grow(e.Len(), len(e.t.uids))
	for uid, ep := range e.All() {
		if keep(ep) {
			b.add(uid, ep)
		}
	}
	return b.set()
}

// endpointBuilder builds a set from endpoints added in uid order.
type endpointBuilder struct {
	t    endpointTable
	uids strings.Builder
}

// grow makes room for n endpoints whose uids have size bytes.
func (b *endpointBuilder) grow(n, size int) {
	b.t.ents = make([]endpointEntry, 0, n)
	b.uids.Grow(size)
}

func (b *endpointBuilder) add(uid string, ep Endpoint) {
	b.t.ents = append(b.t.ents, endpointEntry{off: uint32(b.uids.Len()), n: uint32(len(uid)), ports: b.t.portsIndex(ep.Ports), status: ep.Status})
	b.uids.WriteString(uid)
}

func (b *endpointBuilder) set() EndpointSet {
	if len(b.t.ents) == 0 {
		return EndpointSet{}
	}
	t := b.t
	t.uids = b.uids.String()
	return EndpointSet{&t}
}

// maxPortsSearch bounds how many of a set's distinct port maps a new entry
// is compared with, so that a set whose endpoints all map ports
// differently is built in linear time (and lists some maps twice).
const maxPortsSearch = 4

// portsIndex returns the index in t.ports of a map equal to p (nil and
// empty told apart), adding p if the last few differ.
func (t *endpointTable) portsIndex(p PortMap) uint32 {
	for i := len(t.ports) - 1; i >= max(0, len(t.ports)-maxPortsSearch); i-- {
		if q := t.ports[i]; (q == nil) == (p == nil) && maps.Equal(q, p) {
			return uint32(i)
		}
	}
	t.ports = append(t.ports, p)
	return uint32(len(t.ports) - 1)
}

// Len returns the number of endpoints.
func (e EndpointSet) Len() int {
	if e.t == nil {
		return 0
	}
	return len(e.t.ents)
}

func (e EndpointSet) uid(i int) string {
	x := e.t.ents[i]
	return e.t.uids[x.off : x.off+x.n]
}

func (e EndpointSet) at(i int) Endpoint {
	x := e.t.ents[i]
	return Endpoint{WorkloadUID: e.uid(i), Ports: e.t.ports[x.ports], Status: x.status}
}

// search returns the index of uid's entry; false if it has none.
func (e EndpointSet) search(uid string) (int, bool) {
	if e.t == nil {
		return 0, false
	}
	return slices.BinarySearchFunc(e.t.ents, uid, func(x endpointEntry, uid string) int {
		return cmp.Compare(e.t.uids[x.off:x.off+x.n], uid)
	})
}

// Get returns the endpoint of workload uid; false if it is not one.
func (e EndpointSet) Get(uid string) (Endpoint, bool) {
	i, ok := e.search(uid)
	if !ok {
		return Endpoint{}, false
	}
	return e.at(i), true
}

// Has reports whether workload uid is an endpoint.
func (e EndpointSet) Has(uid string) bool {
	_, ok := e.search(uid)
	return ok
}

// All yields each endpoint with its workload uid, ordered by uid. It
// allocates nothing.
func (e EndpointSet) All() iter.Seq2[string, Endpoint] {
	return func(yield func(string, Endpoint) bool) {
		for i := range e.Len() {
			if !yield(e.uid(i), e.at(i)) {
				return
			}
		}
	}
}

// UIDs yields the endpoints' workload uids in order.
func (e EndpointSet) UIDs() iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := range e.Len() {
			if !yield(e.uid(i)) {
				return
			}
		}
	}
}

// Map returns the endpoints as a new map by workload uid.
func (e EndpointSet) Map() map[string]Endpoint {
	m := make(map[string]Endpoint, e.Len())
	for uid, ep := range e.All() {
		m[uid] = ep
	}
	return m
}

// Equal reports whether e and o hold the same endpoints (go-cmp uses it).
func (e EndpointSet) Equal(o EndpointSet) bool {
	if e.Len() != o.Len() {
		return false
	}
	for i := range e.Len() {
		a, b := e.at(i), o.at(i)
		if a.WorkloadUID != b.WorkloadUID || a.Status != b.Status || !maps.Equal(a.Ports, b.Ports) {
			return false
		}
	}
	return true
}

// String lists the endpoints' uids, for test failures.
func (e EndpointSet) String() string {
	return "[" + strings.Join(slices.Collect(e.UIDs()), " ") + "]"
}
