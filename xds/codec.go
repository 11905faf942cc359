package xds

import (
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// pushCodec is the codec of one xDS stream (grpc.ForceCodecV2): gRPC's own
// proto codec, except that a response of relaxGCMinBytes or more is
// unmarshalled with the collector relaxed (gcpace.go), and the relaxation
// is handed to the receive loop (take), which passes it on to
// handleResponse, so that unmarshalling and applying a large push run under
// one relaxation. Requests and small responses go straight to the proto
// codec, allocating nothing more.
//
// Invariants:
//   - pending is the relaxation started for msg, the last message
//     unmarshalled, until take hands it over; nil when none is waiting.
//   - Every relaxation is ended exactly once: by Unmarshal when its message
//     does not decode, by whoever takes it, or, never taken, by the next
//     large Unmarshal or by drop.
//   - gRPC unmarshals on the goroutine that called Recv, one message at a
//     time; mu is there because a codec must be safe for concurrent use.
type pushCodec struct {
	proto encoding.CodecV2
	relax func(size int) *gcRelaxation // relaxGCForWire; tests wrap it

	mu      sync.Mutex
	msg     any
	pending *gcRelaxation
}

var _ encoding.CodecV2 = (*pushCodec)(nil)

// newPushCodec returns a stream's codec; unless tune (Config.TunePushes)
// it is gRPC's proto codec and nothing more.
func newPushCodec(tune bool) *pushCodec {
	pc := &pushCodec{proto: encoding.GetCodecV2(grpcproto.Name)}
	if tune {
		pc.relax = relaxGCForWire
	}
	return pc
}

// Name is the proto codec's, "proto": requests carry content-type
// application/grpc+proto, as gRPC sends whenever a call forces a codec.
func (pc *pushCodec) Name() string { return pc.proto.Name() }

// Marshal is the proto codec's.
func (pc *pushCodec) Marshal(v any) (mem.BufferSlice, error) { return pc.proto.Marshal(v) }

// Unmarshal decodes data into v with the proto codec, relaxing the
// collector first if data is large.
func (pc *pushCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if pc.relax == nil || data.Len() < relaxGCMinBytes {
		return pc.proto.Unmarshal(data, v)
	}
	pc.drop()
	r := pc.relax(data.Len())
	// A large push's unmarshal is a CPU-bound run of tens of milliseconds,
	// like its decoding and applying (client_apply.go): it runs on a
	// low-priority thread too, so that data-path threads go first
	// (measurements: bench/NOTES.md, "Why a large push runs at low
	// priority").
	var err error
	runLowPriority(func() { err = pc.proto.Unmarshal(data, v) })
	if err != nil {
		r.end()
		return err
	}
	if r != nil {
		pc.mu.Lock()
		pc.msg, pc.pending = v, r
		pc.mu.Unlock()
	}
	return nil
}

// take returns the relaxation started for resp, or nil; the caller must
// end it. A relaxation left waiting for another message is ended.
func (pc *pushCodec) take(resp *discoveryv3.DeltaDiscoveryResponse) *gcRelaxation {
	pc.mu.Lock()
	r, msg := pc.pending, pc.msg
	pc.msg, pc.pending = nil, nil
	pc.mu.Unlock()
	if r != nil && msg != any(resp) {
		r.end()
		return nil
	}
	return r
}

// drop ends the relaxation waiting to be taken, if any: at the end of the
// stream, and before another one starts (which would wait for it).
func (pc *pushCodec) drop() {
	pc.mu.Lock()
	r := pc.pending
	pc.msg, pc.pending = nil, nil
	pc.mu.Unlock()
	r.end()
}
