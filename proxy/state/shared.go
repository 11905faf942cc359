package state

import (
	"cmp"
	"encoding/binary"
	"maps"
	"reflect"
	"slices"
	"sync/atomic"
	"unsafe"
)

// wshared is what a workload's record names by its shared index: the
// fields that hold pointers, which workloads of one service or one
// deployment have in common. An entry is never modified once stored.
type wshared struct {
	services map[string]PortMap
	policies []string
	waypoint *GatewayAddress
	netgw    *GatewayAddress
	apptun   *ApplicationTunnel
	key      string // sharedKey of the entry
}

// workloadTables is what the snapshots of one store share for their
// workloads: the shared entries, and the cache of workloads built from
// records. Only the store's writer (Update holds its lock) touches ents,
// keys and nextCompact; a snapshot sees the entries that existed when it
// was made through its own slice of ents, to which the writer only
// appends (or which it replaces, when it compacts).
type workloadTables struct {
	ents        []wshared // ents[recNoShared] is the zero entry
	keys        map[string]uint32
	nextCompact int // compact when ents reaches this length

	cache [cacheSize]atomic.Pointer[builtWorkload]
}

// cacheSize is the number of workloads the store keeps built, by slot
// number modulo cacheSize: every workload of a store of up to 4,096, and
// the ones last looked up in a larger one. A built workload is ~400
// bytes.
const cacheSize = 4096

// compactSlack is how many entries beyond twice the live ones the table
// may grow to before the writer compacts it. Tests lower it.
var compactSlack = 1024

func newWorkloadTables() *workloadTables {
	return &workloadTables{
		ents:        []wshared{{}},
		keys:        map[string]uint32{},
		nextCompact: 1 + compactSlack,
	}
}

// sharedIdent is the identity of a workload's shared fields: workloads
// whose fields are the same objects (the decoder shares a services map,
// policy list and gateways among the workloads of a push that have equal
// ones) have equal shared entries, found without building their key.
type sharedIdent struct {
	services unsafe.Pointer
	policies *string
	npol     int
	waypoint *GatewayAddress
	netgw    *GatewayAddress
	apptun   *ApplicationTunnel
}

func identOf(w *Workload) sharedIdent {
	return sharedIdent{
		services: reflect.ValueOf(w.Services).UnsafePointer(),
		policies: unsafe.SliceData(w.AuthorizationPolicies), npol: len(w.AuthorizationPolicies),
		waypoint: w.Waypoint, netgw: w.NetworkGateway, apptun: w.ApplicationTunnel,
	}
}

// interner is a batch's way into its store's shared table: memo remembers,
// for the batch only (it holds the callers' objects), the entry each
// identity of shared fields got; key is scratch space for building keys.
type interner struct {
	memo map[sharedIdent]uint32
	key  []byte
}

// intern returns the index of w's shared entry, adding it if it is new.
func (t *workloadTables) intern(w *Workload, in *interner) uint32 {
	if w.Services == nil && w.AuthorizationPolicies == nil && w.Waypoint == nil &&
		w.NetworkGateway == nil && w.ApplicationTunnel == nil {
		return recNoShared
	}
	id := identOf(w)
	if i, ok := in.memo[id]; ok {
		return i
	}
	if in.memo == nil {
		in.memo = make(map[sharedIdent]uint32)
	}
	k := appendSharedKey(in.key[:0], w)
	in.key = k
	if i, ok := t.keys[string(k)]; ok {
		in.memo[id] = i
		return i
	}
	e := wshared{
		services: w.Services, policies: w.AuthorizationPolicies,
		waypoint: w.Waypoint, netgw: w.NetworkGateway, apptun: w.ApplicationTunnel,
		key: string(k),
	}
	i := uint32(len(t.ents))
	t.ents = append(t.ents, e)
	t.keys[e.key] = i
	in.memo[id] = i
	return i
}

// appendSharedKey appends a key for w's shared fields to dst: equal keys
// mean equal fields (nil and empty told apart, maps in key order).
func appendSharedKey(dst []byte, w *Workload) []byte {
	str := func(s string) {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	present := func(ok bool) bool {
		if ok {
			dst = append(dst, 1)
		} else {
			dst = append(dst, 0)
		}
		return ok
	}
	if present(w.Services != nil) {
		dst = binary.AppendUvarint(dst, uint64(len(w.Services)))
		var kbuf [4]string
		for _, k := range sortedMapKeys(w.Services, kbuf[:0]) {
			str(k)
			pm := w.Services[k]
			if !present(pm != nil) {
				continue
			}
			dst = binary.AppendUvarint(dst, uint64(len(pm)))
			var pbuf [8]uint16
			for _, sp := range sortedMapKeys(pm, pbuf[:0]) {
				dst = binary.LittleEndian.AppendUint16(dst, sp)
				dst = binary.LittleEndian.AppendUint16(dst, pm[sp])
			}
		}
	}
	if present(w.AuthorizationPolicies != nil) {
		dst = binary.AppendUvarint(dst, uint64(len(w.AuthorizationPolicies)))
		for _, p := range w.AuthorizationPolicies {
			str(p)
		}
	}
	for _, g := range [2]*GatewayAddress{w.Waypoint, w.NetworkGateway} {
		if !present(g != nil) {
			continue
		}
		if present(g.Hostname != nil) {
			str(g.Hostname.Namespace)
			str(g.Hostname.Hostname)
		}
		if present(g.Address != nil) {
			str(g.Address.Network)
			dst, _ = g.Address.Address.AppendBinary(dst)
		}
		dst = binary.LittleEndian.AppendUint16(dst, g.HBONEMTLSPort)
	}
	if present(w.ApplicationTunnel != nil) {
		dst = append(dst, byte(w.ApplicationTunnel.Protocol))
		dst = binary.LittleEndian.AppendUint16(dst, w.ApplicationTunnel.Port)
	}
	return dst
}

// sortedMapKeys appends m's keys to dst in order.
func sortedMapKeys[K cmp.Ordered, V any](m map[K]V, dst []K) []K {
	dst = slices.AppendSeq(dst, maps.Keys(m))
	slices.Sort(dst)
	return dst
}

// shouldCompact reports whether the table has grown enough since it was
// last compacted that the entries no record names may be most of it.
func (t *workloadTables) shouldCompact() bool { return len(t.ents) >= t.nextCompact }

// compact keeps only the entries that recs name, renumbered, and returns
// recs with every record whose index changed replaced (recs is modified
// in place: the caller owns it).
func (t *workloadTables) compact(recs []string) {
	remap := make(map[uint32]uint32)
	ents := []wshared{{}}
	for slot, rec := range recs {
		if rec == "" {
			continue
		}
		i := recSharedOf(rec)
		if i == recNoShared {
			continue
		}
		j, ok := remap[i]
		if !ok {
			j = uint32(len(ents))
			ents = append(ents, t.ents[i])
			remap[i] = j
		}
		if j != i {
			recs[slot] = withShared(rec, j)
		}
	}
	keys := make(map[string]uint32, len(ents))
	for i, e := range ents[1:] {
		keys[e.key] = uint32(i + 1)
	}
	t.ents, t.keys = ents, keys
	t.nextCompact = 2*len(ents) + compactSlack
}
