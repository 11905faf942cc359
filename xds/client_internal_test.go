package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gozt/gozt/state"
)

func TestClassifyStreamEnd(t *testing.T) {
	tests := []struct {
		err  error
		want terminationReason
	}{
		{nil, reasonComplete},
		{context.Canceled, reasonError}, // not a gRPC status
		{status.Error(codes.Unknown, "x"), reasonReconnect},
		{status.Error(codes.Canceled, "x"), reasonReconnect},
		{status.Error(codes.DeadlineExceeded, "x"), reasonReconnect},
		{status.Error(codes.Unavailable, "transport is closing"), reasonReconnect},
		{status.Error(codes.Unavailable, "closing transport due to: EOF, received prior goaway: max_age"), reasonReconnect},
		{status.Error(codes.Unavailable, "connection refused"), reasonError},
		{status.Error(codes.PermissionDenied, "no"), reasonError},
		{status.Error(codes.Internal, "boom"), reasonError},
	}
	for _, tt := range tests {
		if got := classifyStreamEnd(tt.err).reason; got != tt.want {
			t.Errorf("classifyStreamEnd(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestNewClientErrors(t *testing.T) {
	cli := &tls.Config{}
	st := state.NewStore(state.Config{})
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"http", Config{Address: "http://istiod:15012", TLS: cli, Store: st}, "https"},
		{"path", Config{Address: "https://istiod:15012/x", TLS: cli, Store: st}, "want https://host:port"},
		{"authorization header", Config{Address: "https://istiod:15012", TLS: cli, Store: st, Headers: map[string]string{"Authorization": "x"}}, "reserved"},
		{"no host", Config{Address: "https://:15012", TLS: cli, Store: st}, "no host"},
		{"no tls", Config{Address: "https://istiod:15012", Store: st}, "TLS"},
		{"no store", Config{Address: "https://istiod:15012", TLS: cli}, "Store"},
		{"bad header name", Config{Address: "https://istiod:15012", TLS: cli, Store: st, Headers: map[string]string{"a b": "v"}}, `header "a b"`},
		{"reserved header", Config{Address: "https://istiod:15012", TLS: cli, Store: st, Headers: map[string]string{"grpc-timeout": "1"}}, "reserved"},
		{"bad header value", Config{Address: "https://istiod:15012", TLS: cli, Store: st, Headers: map[string]string{"x": "a\nb"}}, "printable"},
	}
	for _, tt := range tests {
		if _, err := NewClient(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewClient(%s) = %v, want error containing %q", tt.name, err, tt.want)
		}
	}
	for _, addr := range []string{"https://istiod.istio-system.svc", "istiod.istio-system.svc"} {
		c, err := NewClient(Config{Address: addr, TLS: cli, Store: st})
		if err != nil || c.target != "passthrough:///istiod.istio-system.svc:443" {
			t.Errorf("NewClient(%q) = %v; want target port 443", addr, err)
		}
	}
}

func TestNACKMessageBounded(t *testing.T) {
	var rejects []rejection
	for i := range 100_000 {
		rejects = append(rejects, rejection{fmt.Sprintf("Kubernetes//Pod/ns/pod-%d", i), errors.New("address of 5 bytes, want 4 or 16")})
	}
	msg := nackMessage(rejects)
	if len(msg) > maxNACKMessage+64 {
		t.Errorf("NACK message is %d bytes, want ≤ %d", len(msg), maxNACKMessage+64)
	}
	if !strings.HasPrefix(msg, "Kubernetes//Pod/ns/pod-0: address of 5 bytes") || !strings.Contains(msg, " more") {
		t.Errorf("NACK message = %.100q...%q", msg, msg[len(msg)-30:])
	}
	if got := nackMessage(rejects[:2]); got != "Kubernetes//Pod/ns/pod-0: address of 5 bytes, want 4 or 16; Kubernetes//Pod/ns/pod-1: address of 5 bytes, want 4 or 16" {
		t.Errorf("nackMessage(2) = %q", got)
	}
}

// TestRepushKeepsTableSizes: istiod sending every workload again in a new
// version leaves the store's live heap near where the first push left it.
// The batch and the client's table of versions make room only for names
// that are new. Room for the whole push again doubled the store's workload
// tables (37% more live heap here; maps.Clone keeps that size in every later
// snapshot) and the versions table (12%). What remains (6%) is in the
// cloned tables and the second response's strings.
func TestRepushKeepsTableSizes(t *testing.T) {
	const n = 20_000
	st := state.NewStore(state.Config{})
	c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	live := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	push := func(version string) {
		t.Helper()
		// A response of its own each time: handleResponse takes its payloads.
		resp := benchPush(t, n, n/10)
		for _, r := range resp.Resources {
			r.Version = version // a new version is applied, not skipped
		}
		if req, ack := c.handleResponse(resp, nil); !ack {
			t.Fatalf("NACK: %.200s", req.GetErrorDetail().GetMessage())
		}
	}
	base := live()
	push("v1")
	first := live() - base
	if got, _, _ := st.Snapshot().Counts(); got != n {
		t.Fatalf("%d workloads after the push, want %d", got, n)
	}
	push("v2")
	second := live() - base
	if got, _, _ := st.Snapshot().Counts(); got != n { // keeps the store live through live()
		t.Fatalf("%d workloads after the second push, want %d", got, n)
	}
	if second > first+first/10 {
		t.Errorf("live heap grew by %d B after the same %d workloads again, %d B after the first push: more than 10%% more", second, n, first)
	}
	runtime.KeepAlive(c)
}
