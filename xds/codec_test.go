package xds

import (
	"bytes"
	"fmt"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// wireOf returns resp's wire form as one buffer.
func wireOf(t *testing.T, resp *discoveryv3.DeltaDiscoveryResponse) mem.BufferSlice {
	t.Helper()
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}
}

// recordingCodec is a proto codec that records GOGC when it unmarshals.
type recordingCodec struct {
	encoding.CodecV2
	percent *int
}

func (rc recordingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*rc.percent, _ = gcSettings()
	return rc.CodecV2.Unmarshal(data, v)
}

// testCodec returns a pushCodec whose relaxations are appended to started,
// and that records GOGC at each unmarshal in percent.
func testCodec(started *[]*gcRelaxation, percent *int) *pushCodec {
	pc := newPushCodec(true)
	pc.proto = recordingCodec{pc.proto, percent}
	pc.relax = func(size int) *gcRelaxation {
		r := relaxGCForWire(size)
		*started = append(*started, r)
		return r
	}
	return pc
}

// endLeaked ends the relaxations of started that were never ended, so that
// a test that found one can report it rather than deadlock the next one.
func endLeaked(started []*gcRelaxation) {
	for _, r := range started {
		if r != nil && r.ended == 0 {
			r.end()
		}
	}
}

// largeResponse returns a response of one resource whose payload makes it
// size bytes or more on the wire.
func largeResponse(size int) *discoveryv3.DeltaDiscoveryResponse {
	return &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "big", Resources: []*discoveryv3.Resource{{
		Name: "big", Resource: &anypb.Any{TypeUrl: AddressTypeURL, Value: bytes.Repeat([]byte{'x'}, size)},
	}}}
}

func TestPushCodecRelaxesForLargeResponses(t *testing.T) {
	withGCPercent100(t)
	var started []*gcRelaxation
	var percent int
	pc := testCodec(&started, &percent)

	t.Run("small", func(t *testing.T) {
		started = nil
		t.Cleanup(func() { endLeaked(started) })
		want := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "small"}
		got := new(discoveryv3.DeltaDiscoveryResponse)
		if err := pc.Unmarshal(wireOf(t, want), got); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("Unmarshal = %v, want %v", got, want)
		}
		if len(started) != 0 || percent != 100 {
			t.Errorf("small response: %d relaxations, GOGC %d while unmarshalling; want none and 100", len(started), percent)
		}
		if r := pc.take(got); r != nil {
			t.Errorf("take after a small response = %+v, want nil", r)
		}
	})

	t.Run("large", func(t *testing.T) {
		started = nil
		t.Cleanup(func() { endLeaked(started) })
		want := largeResponse(relaxGCMinBytes)
		got := new(discoveryv3.DeltaDiscoveryResponse)
		if err := pc.Unmarshal(wireOf(t, want), got); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		if !proto.Equal(got, want) {
			t.Error("Unmarshal did not decode the large response")
		}
		if len(started) != 1 || started[0] == nil {
			t.Fatalf("large response: relaxations %v, want one", started)
		}
		if percent != relaxedGCPercent {
			t.Errorf("GOGC %d while unmarshalling, want %d", percent, relaxedGCPercent)
		}
		wantGCPercent(t, "after Unmarshal, before take", relaxedGCPercent)
		if r := pc.take(new(discoveryv3.DeltaDiscoveryResponse)); r != nil {
			t.Error("take handed the relaxation over for another message")
		}
		if r := started[0]; r.ended != 1 {
			t.Errorf("relaxation left for another message ended %d times, want 1", r.ended)
		}
		wantGCPercent(t, "after the relaxation was dropped", 100)
		wantSettingsFree(t, "after the relaxation was dropped")
	})

	t.Run("handed over", func(t *testing.T) {
		started = nil
		t.Cleanup(func() { endLeaked(started) })
		got := new(discoveryv3.DeltaDiscoveryResponse)
		if err := pc.Unmarshal(wireOf(t, largeResponse(relaxGCMinBytes)), got); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		r := pc.take(got)
		if r == nil || len(started) != 1 || r != started[0] {
			t.Fatalf("take = %p, want the relaxation started (%v)", r, started)
		}
		if r2 := pc.take(got); r2 != nil {
			t.Error("second take handed the relaxation over again")
		}
		pc.drop()
		if r.ended != 0 {
			t.Errorf("relaxation taken ended %d times by the codec, want 0", r.ended)
		}
		wantGCPercent(t, "after take", relaxedGCPercent)
		r.end()
		wantGCPercent(t, "after end", 100)
		wantSettingsFree(t, "after end")
	})

	t.Run("decode fails", func(t *testing.T) {
		started = nil
		t.Cleanup(func() { endLeaked(started) })
		bad := bytes.Repeat([]byte{0xff}, relaxGCMinBytes)
		got := new(discoveryv3.DeltaDiscoveryResponse)
		if err := pc.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, got); err == nil {
			t.Fatal("Unmarshal of garbage succeeded")
		}
		if len(started) != 1 || started[0] == nil {
			t.Fatalf("large garbage: relaxations %v, want one", started)
		}
		if r := started[0]; r.ended != 1 {
			t.Errorf("relaxation of a message that did not decode ended %d times, want 1", r.ended)
		}
		if r := pc.take(got); r != nil {
			t.Error("take handed over the relaxation of a message that did not decode")
		}
		wantGCPercent(t, "after a failed decode", 100)
		wantSettingsFree(t, "after a failed decode")
	})

	t.Run("never taken", func(t *testing.T) {
		started = nil
		t.Cleanup(func() { endLeaked(started) })
		wire := wireOf(t, largeResponse(relaxGCMinBytes))
		for range 2 {
			if err := pc.Unmarshal(wire, new(discoveryv3.DeltaDiscoveryResponse)); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
		}
		if len(started) != 2 || started[0].ended != 1 || started[1].ended != 0 {
			t.Fatalf("two large responses never taken: relaxations %v, want the first ended once, the second in force", started)
		}
		pc.drop()
		if started[1].ended != 1 {
			t.Errorf("relaxation dropped at the end of the stream ended %d times, want 1", started[1].ended)
		}
		wantSettingsFree(t, "after drop")
	})
}

// TestPushCodecSmallAllocs checks that a small response costs no allocation
// beyond what gRPC's proto codec makes.
func TestPushCodecSmallAllocs(t *testing.T) {
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AuthorizationTypeURL, Nonce: "n", SystemVersionInfo: "v"}
	for i := range 3 {
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: fmt.Sprintf("ns/p%d", i), Version: "1"})
	}
	data := wireOf(t, resp)
	pc, plain := newPushCodec(true), encoding.GetCodecV2("proto")
	allocs := func(c encoding.CodecV2) float64 {
		var m discoveryv3.DeltaDiscoveryResponse
		return testing.AllocsPerRun(100, func() {
			if err := c.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
		})
	}
	if got, want := allocs(pc), allocs(plain); got != want {
		t.Errorf("pushCodec.Unmarshal of a small response: %v allocations, want the proto codec's %v", got, want)
	}
}
