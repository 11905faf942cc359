package state

import (
	"cmp"
	"encoding/binary"
	"maps"
	"slices"
	"sync/atomic"
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
	key      string // appendSharedKey of the entry
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

// intern returns the index of w's shared entry, adding it if it is new;
// key is scratch space for building the entry's key. An entry's gateway
// addresses are unmapped.
func (t *workloadTables) intern(w *Workload, key *[]byte) uint32 {
	if w.Services == nil && w.AuthorizationPolicies == nil && w.Waypoint == nil &&
		w.NetworkGateway == nil && w.ApplicationTunnel == nil {
		return recNoShared
	}
	k := appendSharedKey((*key)[:0], w)
	*key = k
	if i, ok := t.keys[string(k)]; ok {
		return i
	}
	e := wshared{
		services: w.Services, policies: w.AuthorizationPolicies,
		waypoint: normalizedGateway(w.Waypoint), netgw: normalizedGateway(w.NetworkGateway),
		apptun: w.ApplicationTunnel, key: string(k),
	}
	i := uint32(len(t.ents))
	t.ents = append(t.ents, e)
	t.keys[e.key] = i
	return i
}

// normalizedGateway is normalizeGateway for a gateway that may be nil.
func normalizedGateway(g *GatewayAddress) *GatewayAddress {
	if g == nil {
		return nil
	}
	return normalizeGateway(g)
}

// appendSharedKey appends a key for w's shared fields to dst: equal keys
// mean equal fields once gateway addresses are unmapped (nil and empty
// told apart, maps in key order).
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
			dst, _ = g.Address.Address.Unmap().AppendBinary(dst)
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

// compact keeps only the entries that recs name, renumbered, and replaces
// in recs every record whose index changed (recs is modified in place: the
// caller owns it).
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
