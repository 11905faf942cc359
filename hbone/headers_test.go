package hbone

import (
	"net/http"
	"strings"
	"testing"
)

// TestHeaderNameConversions: canonicalKey and wireName agree with
// http.CanonicalHeaderKey and strings.ToLower for every name, and for the
// names Istio's CONNECTs carry they make no new string.
func TestHeaderNameConversions(t *testing.T) {
	for _, wire := range []string{"baggage", "forwarded", "traceparent", "tracestate", "x-forwarded-network", "x-custom", "user-agent"} {
		key := http.CanonicalHeaderKey(wire)
		if got := canonicalKey(wire); got != key {
			t.Errorf("canonicalKey(%q) = %q, want %q", wire, got, key)
		}
		if got := wireName(key); got != strings.ToLower(key) {
			t.Errorf("wireName(%q) = %q, want %q", key, got, strings.ToLower(key))
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = wireName(canonicalKey("x-forwarded-network"))
	}); n != 0 {
		t.Errorf("converting a known name both ways allocates %v times, want 0", n)
	}
}
