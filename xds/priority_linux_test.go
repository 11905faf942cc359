package xds

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
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

// niceCodec records the nice value of the thread it unmarshals on.
type niceCodec struct {
	encoding.CodecV2
	nice *int
}

func (nc niceCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*nc.nice = threadNice()
	return nc.CodecV2.Unmarshal(data, v)
}

// TestLargeUnmarshalRunsAtLowPriority: a push large enough to relax the
// collector is unmarshalled on a thread at nice 19, like its decoding and
// applying, and a small response on the caller's own thread, whose
// priority is untouched.
func TestLargeUnmarshalRunsAtLowPriority(t *testing.T) {
	withGCPercent100(t)
	own := threadNice()
	pc := newPushCodec()
	var nice int
	pc.proto = niceCodec{pc.proto, &nice}

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
	if n := threadNice(); n != own {
		t.Errorf("caller's thread at nice %d after a large unmarshal, want %d", n, own)
	}
}
