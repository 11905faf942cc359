package state

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/gozt/gozt/internal/gctest"
)

// markModelWorkloads is the number of workloads of the mark benchmarks:
// xds's BenchmarkStoreMark100k's push.
const markModelWorkloads = 100_000

// BenchmarkMarkWorkloads100k measures what marking 100,000 Workload
// records costs the collector, shaped like xds's benchmark push (unique
// uid, name and address; namespace, service account, node and the other
// shared strings interned, one service map shared by many), without the
// store's indexes. BenchmarkMarkPointerFree100k marks the same number of
// records with the same bytes of strings but no pointers: what keeping
// workloads as string handles into an arena would cost (bench/NOTES.md,
// the push stall).
func BenchmarkMarkWorkloads100k(b *testing.B) {
	shared := []string{"ns1", "sa", "node-1", "deploy-1", "app-1", "v1", "Kubernetes"}
	svc := map[string]PortMap{"ns1/svc1.ns1.svc.cluster.local": {80: 8080}}
	ws := make([]*Workload, markModelWorkloads)
	for i := range ws {
		ws[i] = &Workload{
			UID: fmt.Sprintf("Kubernetes//Pod/ns1/pod-%d", i), Name: "pod-" + strconv.Itoa(i),
			Namespace: shared[0], ServiceAccount: shared[1], Node: shared[2], WorkloadName: shared[3],
			CanonicalName: shared[4], CanonicalRevision: shared[5], ClusterID: shared[6],
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})},
			Services:  svc, Protocol: TunnelHBONE,
		}
	}
	gctest.ReportMarkCPU(b, ws)
}

// pointerFreeWorkload is a model of a workload record whose strings are
// offsets into one byte arena: the size of a Workload (360 bytes on
// 64-bit platforms), and no pointers.
type pointerFreeWorkload struct {
	strs [16]struct{ off, len uint32 } // uid, name, namespace, ...
	addr [16]byte
	_    [216]byte // the rest of a Workload's fields
}

func BenchmarkMarkPointerFree100k(b *testing.B) {
	var arena []byte
	ws := make([]*pointerFreeWorkload, markModelWorkloads)
	for i := range ws {
		w := &pointerFreeWorkload{addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).As16()}
		for f, s := range []string{fmt.Sprintf("Kubernetes//Pod/ns1/pod-%d", i), "pod-" + strconv.Itoa(i)} {
			w.strs[f].off, w.strs[f].len = uint32(len(arena)), uint32(len(s))
			arena = append(arena, s...)
		}
		ws[i] = w
	}
	gctest.ReportMarkCPU(b, []any{ws, arena})
}
