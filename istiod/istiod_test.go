package istiod

import (
	"slices"
	"strings"
	"testing"
)

func TestHostPort(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "https://istiod.istio-system.svc:15012", want: "istiod.istio-system.svc:15012"},
		{in: "istiod.istio-system.svc:15012", want: "istiod.istio-system.svc:15012"}, // the chart's form
		{in: "https://istiod", want: "istiod:443"},
		{in: "istiod", want: "istiod:443"},
		{in: "https://[::1]:15012/", want: "[::1]:15012"},
		{in: "[fd00::1]:15012", want: "[fd00::1]:15012"},
		{in: "", err: "empty address"},
		{in: "http://istiod:15010", err: `scheme "http"`},
		{in: "grpc://istiod:15012", err: `scheme "grpc"`},
		{in: "https://:15012", err: "no host"},
		{in: "https://istiod:15012/path", err: "want https://host:port"},
		{in: "https://istiod:15012?x=1", err: "want https://host:port"},
		{in: "https://user@istiod:15012", err: "want https://host:port"},
	} {
		got, err := HostPort(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("HostPort(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("HostPort(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	kv, err := Headers(map[string]string{"X_TEST": "1", "a.b-c": "two words"})
	if err != nil || !slices.Equal(kv, []string{"a.b-c", "two words", "x_test", "1"}) {
		t.Errorf("Headers = %q, %v", kv, err)
	}
	for _, tc := range []struct {
		name, value, err string
	}{
		{"authorization", "Bearer x", "reserved"},
		{"ClusterID", "c", "reserved"},
		{"grpc-timeout", "1S", "reserved"},
		{"trace-bin", "x", "binary"},
		{"bad name", "x", "invalid gRPC metadata name"},
		{"", "x", "invalid gRPC metadata name"},
		{"x", "caf\u00e9", "printable ASCII"},
		{"x", "a\nb", "printable ASCII"},
	} {
		_, err := Headers(map[string]string{tc.name: tc.value})
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("Headers(%q: %q) error = %v, want %q", tc.name, tc.value, err, tc.err)
		}
	}
}
