package xds

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// threadNice returns the nice value of the calling thread
// (/proc/thread-self/stat field 19), or -100 if it cannot be read.
func threadNice() int {
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		return -100
	}
	f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
	n, err := strconv.Atoi(string(f[16]))
	if err != nil {
		return -100
	}
	return n
}

// threadSlice returns the time slice the kernel reports for the calling
// thread, or 0 where it reports none (before Linux 6.12).
func threadSlice() time.Duration {
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return 0
	}
	return time.Duration(attr.Runtime)
}

// niceCodec records the nice value and time slice of the thread it
// unmarshals on.
type niceCodec struct {
	encoding.CodecV2
	nice  *int
	slice *time.Duration
}

func (nc niceCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*nc.nice, *nc.slice = threadNice(), threadSlice()
	return nc.CodecV2.Unmarshal(data, v)
}

// TestLargeUnmarshalRunsAtLowPriority: a push large enough to relax the
// collector is unmarshalled on a thread at nice 19 with the shortest time
// slice (where the kernel has slices), like its decoding and applying, and
// a small response on the caller's own thread, whose priority is
// untouched.
func TestLargeUnmarshalRunsAtLowPriority(t *testing.T) {
	withGCPercent100(t)
	own, ownSlice := threadNice(), threadSlice()
	pc := newPushCodec(true)
	var nice int
	var slice time.Duration
	pc.proto = niceCodec{pc.proto, &nice, &slice}

	if err := pc.Unmarshal(wireOf(t, &discoveryv3.DeltaDiscoveryResponse{Nonce: "small"}), new(discoveryv3.DeltaDiscoveryResponse)); err != nil {
		t.Fatal(err)
	}
	if nice != own {
		t.Errorf("small response unmarshalled at nice %d, want the caller's %d", nice, own)
	}
	got := new(discoveryv3.DeltaDiscoveryResponse)
	if err := pc.Unmarshal(wireOf(t, largeResponse(relaxGCMinBytes)), got); err != nil {
		t.Fatal(err)
	}
	pc.take(got).end()
	if nice != lowPriorityNice {
		t.Errorf("large response unmarshalled at nice %d, want %d", nice, lowPriorityNice)
	}
	if ownSlice != 0 && slice != lowSlice {
		t.Errorf("large response unmarshalled with a %v slice, want %v (the caller's is %v)", slice, lowSlice, ownSlice)
	}
	if n := threadNice(); n != own {
		t.Errorf("caller's thread at nice %d after a large unmarshal, want %d", n, own)
	}
}

// TestSmallResponsesApplyAtNormalPriority: a response below lowPriorityMin
// resources (a policy change) is decoded and applied at the caller's
// priority, a larger one on a thread at nice 19.
func TestSmallResponsesApplyAtNormalPriority(t *testing.T) {
	own := threadNice()
	for _, tc := range []struct {
		n    int
		want int
	}{{1, own}, {lowPriorityMin - 1, own}, {lowPriorityMin, lowPriorityNice}} {
		got := -100
		runAtPriority(tc.n, func() { got = threadNice() })
		if got != tc.want {
			t.Errorf("response of %d resources applied at nice %d, want %d", tc.n, got, tc.want)
		}
	}
}
