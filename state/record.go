package state

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"unsafe"
)

// A record is how the store keeps a workload: one string holding every
// field but the pointer-rich ones (services, policies, gateways, the
// application tunnel), which are interned once per store in its shared
// table and named by their index. A record holds no pointer, so a garbage
// collection marks a 100,000-workload store's records as 100,000 string
// objects it never scans, instead of 100,000 Workload structs of 21
// pointer fields each (bench/NOTES.md, the push stall). Lookups build a
// *Workload from the record (strings are substrings of it, not copies) and
// keep the last ones built in the store's cache.
//
// Layout, integers little-endian:
//
//	[0]      flags: recNameSuffix (the name is the uid's suffix), recNative
//	[1]      Protocol
//	[2]      WorkloadType
//	[3]      Status
//	[4]      NetworkMode
//	[5:9]    Capacity
//	[9:13]   shared index (0: no services, policies, gateways or tunnel)
//	strings  recNumStrings of them, in the recUID... order, each as a uvarint
//	         length and its bytes (the name's bytes are left out when
//	         recNameSuffix is set)
//	addrs    a uvarint count+1 (0 for a nil slice), then each address as
//	         its length (4 or 16) and its bytes
//
// Addresses are stored unmapped (appendRecord), and validateWorkload lets
// none with a zone in, so 4 or 16 bytes say all of one.

const (
	recNameSuffix = 1 << iota
	recNative
)

const (
	recFlags = iota
	recProtocol
	recType
	recStatus
	recNetMode
	recCapacity      // 4 bytes
	recShared   = 9  // 4 bytes
	recHeader   = 13 // where the strings start
)

// recNoShared is the shared index of a workload with no services,
// policies, gateways or application tunnel.
const recNoShared = 0

// The record's strings, in order.
const (
	recUID = iota
	recName
	recNamespace
	recHostname
	recNetwork
	recTrustDomain
	recServiceAccount
	recNode
	recCanonicalName
	recCanonicalRevision
	recWorkloadName
	recClusterID
	recRegion
	recZone
	recSubzone
	recNumStrings
)

// appendRecord appends w's record to dst, with shared as its shared index
// and its addresses unmapped.
func appendRecord(dst []byte, w *Workload, shared uint32) []byte {
	var flags byte
	suffix := w.Name != "" && strings.HasSuffix(w.UID, w.Name)
	if suffix {
		flags |= recNameSuffix
	}
	if w.NativeTunnel {
		flags |= recNative
	}
	dst = append(dst, flags, byte(w.Protocol), byte(w.WorkloadType), byte(w.Status), byte(w.NetworkMode))
	dst = binary.LittleEndian.AppendUint32(dst, w.Capacity)
	dst = binary.LittleEndian.AppendUint32(dst, shared)
	for f, s := range [recNumStrings]string{
		w.UID, w.Name, w.Namespace, w.Hostname, w.Network, w.TrustDomain, w.ServiceAccount,
		w.Node, w.CanonicalName, w.CanonicalRevision, w.WorkloadName, w.ClusterID,
		w.Locality.Region, w.Locality.Zone, w.Locality.Subzone,
	} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		if f != recName || !suffix {
			dst = append(dst, s...)
		}
	}
	if w.Addresses == nil {
		return append(dst, 0)
	}
	dst = binary.AppendUvarint(dst, uint64(len(w.Addresses))+1)
	for _, a := range w.Addresses {
		if a = a.Unmap(); a.Is4() {
			b := a.As4()
			dst = append(dst, 4)
			dst = append(dst, b[:]...)
		} else {
			b := a.As16()
			dst = append(dst, 16)
			dst = append(dst, b[:]...)
		}
	}
	return dst
}

// recUvarint reads the uvarint of rec at i and returns it with the index
// after it. Records are the store's own, so no bound is checked beyond
// what indexing does.
func recUvarint(rec string, i int) (uint64, int) {
	if c := rec[i]; c < 0x80 {
		return uint64(c), i + 1
	}
	var v uint64
	for shift := 0; ; shift += 7 {
		c := rec[i]
		i++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, i
		}
	}
}

// recStrings decodes rec's strings up to and including field last into out
// and returns the index after them. The strings are substrings of rec.
func recStrings(rec string, last int, out *[recNumStrings]string) int {
	i := recHeader
	for f := 0; f <= last; f++ {
		n, j := recUvarint(rec, i)
		if f == recName && rec[recFlags]&recNameSuffix != 0 {
			out[f] = out[recUID][len(out[recUID])-int(n):]
			i = j
			continue
		}
		i = j + int(n)
		out[f] = rec[j:i]
	}
	return i
}

// recUIDOf returns rec's uid, a substring of rec.
func recUIDOf(rec string) string {
	n, j := recUvarint(rec, recHeader)
	return rec[j : j+int(n)]
}

// recSharedOf returns rec's shared index.
func recSharedOf(rec string) uint32 {
	return recUint32(rec, recShared)
}

// recUint32 reads the little-endian uint32 of rec at i.
func recUint32(rec string, i int) uint32 {
	return uint32(rec[i]) | uint32(rec[i+1])<<8 | uint32(rec[i+2])<<16 | uint32(rec[i+3])<<24
}

// withShared returns rec with its shared index replaced, as a new record.
func withShared(rec string, shared uint32) string {
	b := []byte(rec)
	binary.LittleEndian.PutUint32(b[recShared:], shared)
	return string(b)
}

// recIPRank is ipRankOf rec's workload, without building it.
func recIPRank(rec string) int {
	return ipRankOf(isPodUID(recUIDOf(rec)), TunnelProtocol(rec[recProtocol]) == TunnelHBONE)
}

// decodeRecord fills w from rec and sh (the shared entry its index names).
// w's strings are substrings of rec; its addresses are written to addrs[:0],
// which w.Addresses then is (nil for a record of a nil slice). It returns
// addrs, grown if it had to be, for reuse.
func decodeRecord(rec string, sh *wshared, w *Workload, addrs []netip.Addr) []netip.Addr {
	var s [recNumStrings]string
	i := recStrings(rec, recNumStrings-1, &s)
	*w = Workload{
		UID: s[recUID], Name: s[recName], Namespace: s[recNamespace], Hostname: s[recHostname],
		Network: s[recNetwork], Protocol: TunnelProtocol(rec[recProtocol]),
		TrustDomain: s[recTrustDomain], ServiceAccount: s[recServiceAccount],
		Waypoint: sh.waypoint, NetworkGateway: sh.netgw,
		Node: s[recNode], CanonicalName: s[recCanonicalName], CanonicalRevision: s[recCanonicalRevision],
		WorkloadType: WorkloadType(rec[recType]), WorkloadName: s[recWorkloadName],
		NativeTunnel:      rec[recFlags]&recNative != 0,
		ApplicationTunnel: sh.apptun, Services: sh.services, AuthorizationPolicies: sh.policies,
		Status: HealthStatus(rec[recStatus]), ClusterID: s[recClusterID],
		Locality:    Locality{Region: s[recRegion], Zone: s[recZone], Subzone: s[recSubzone]},
		NetworkMode: NetworkMode(rec[recNetMode]),
		Capacity:    recUint32(rec, recCapacity),
	}
	n, i := recUvarint(rec, i)
	if n == 0 {
		return addrs
	}
	addrs = addrs[:0]
	for range n - 1 {
		var b [16]byte
		l := copy(b[:rec[i]], rec[i+1:])
		i += 1 + l
		if l == 4 {
			addrs = append(addrs, netip.AddrFrom4([4]byte(b[:4])))
		} else {
			addrs = append(addrs, netip.AddrFrom16(b))
		}
	}
	w.Addresses = addrs
	return addrs
}

// builtWorkload is a Workload built from a record, allocated with room for
// its first address; rec is the record, by which the cache knows it.
type builtWorkload struct {
	Workload
	rec  string
	addr [1]netip.Addr
}

// buildWorkload returns a new Workload built from rec and sh.
func buildWorkload(rec string, sh *wshared) *builtWorkload {
	bw := &builtWorkload{rec: rec}
	decodeRecord(rec, sh, &bw.Workload, bw.addr[:0])
	return bw
}

// sameString reports whether a and b are the same string object: the
// cache's test that an entry was built from the record at hand (records
// are never modified, and an entry keeps its record alive, so no other
// record can have its address).
func sameString(a, b string) bool {
	return len(a) == len(b) && unsafe.StringData(a) == unsafe.StringData(b)
}
