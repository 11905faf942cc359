package inpod_test

import (
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/zdsapi"

	"github.com/gozt/gozt/proxy/inpod"
)

// FuzzRequest sends one arbitrary datagram (with or without a netns fd) to a
// running Manager, as a hostile or broken istio-cni could. Whatever it is,
// the Manager answers it with exactly one Ack, never crashes, and afterwards
// either has stopped with a protocol error (SPEC §9) or still serves
// requests, on this connection or on the one it reconnects with.
func FuzzRequest(f *testing.F) {
	for _, req := range []*zdsapi.WorkloadRequest{
		{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "u1", WorkloadInfo: &zdsapi.WorkloadInfo{Name: "n", Namespace: "ns", ServiceAccount: "sa"}}}},
		{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "u1"}}},
		{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: "u1"}}},
		{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: "u1"}}},
		{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
		f.Add(b, false)
		f.Add(b[:len(b)/2], true)
	}
	f.Add([]byte{}, false)
	f.Add([]byte{0xff, 0xff, 0xff}, true)
	f.Add(make([]byte, 2000), false)

	f.Fuzz(func(t *testing.T, data []byte, withFD bool) {
		h := newHarness(t, func(c *inpod.Config) { c.Logger = slog.New(slog.DiscardHandler) })
		c := h.accept()
		var fds []int
		if withFD {
			ns, err := os.Open("/proc/self/ns/net")
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			fds = append(fds, int(ns.Fd()))
		}
		if err := c.SendRaw(data, fds...); err != nil {
			t.Skipf("datagram not sendable: %v", err) // e.g. larger than the socket allows
		}
		if len(data) == 0 {
			// A zero-length SOCK_SEQPACKET datagram reads as end of file:
			// the Manager reconnects (with a new hello) instead of acking.
			next := h.accept()
			if ack, err := next.Del("nobody"); err != nil || ack != "" {
				t.Fatalf("Del after reconnecting = %q, %v", ack, err)
			}
			return
		}
		if _, err := c.ReadAck(); err != nil {
			t.Fatalf("no Ack for a %d-byte datagram: %v", len(data), err)
		}
		// Still serving: a Del of an unknown uid is answered with success,
		// here or after a reconnect. Or Run ended with a protocol error.
		if ack, err := c.Del("nobody"); err == nil {
			if ack != "" {
				t.Fatalf("Del after the datagram = %q", ack)
			}
			return
		}
		select {
		case err := <-h.done:
			h.done <- err
			if !errors.Is(err, inpod.ErrProtocol) {
				t.Fatalf("Run ended with %v, want a protocol error", err)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		next := h.accept()
		if ack, err := next.Del("nobody"); err != nil || ack != "" {
			t.Fatalf("Del on the new connection = %q, %v", ack, err)
		}
	})
}
