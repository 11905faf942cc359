package inpod_test

import (
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/inpod"
)

func TestNextBackoff(t *testing.T) {
	const (
		min = 10 * time.Millisecond
		max = 15 * time.Second
	)
	tests := []struct {
		name string
		prev time.Duration
		want time.Duration
	}{
		{"first", 0, min},
		{"doubles", min, 20 * time.Millisecond},
		{"doubles again", 20 * time.Millisecond, 40 * time.Millisecond},
		{"below cap", 5120 * time.Millisecond, 10240 * time.Millisecond},
		{"caps", 10240 * time.Millisecond, max},
		{"stays capped", max, max},
		{"negative is first", -time.Second, min},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := inpod.NextBackoffForTest(tt.prev, min, max); got != tt.want {
				t.Errorf("nextBackoff(%v, %v, %v) = %v, want %v", tt.prev, min, max, got, tt.want)
			}
		})
	}

	// The whole sequence from a fresh start: 10ms doubling, then 15s.
	var seq []time.Duration
	d := time.Duration(0)
	for range 13 {
		d = inpod.NextBackoffForTest(d, min, max)
		seq = append(seq, d)
	}
	want := []time.Duration{10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 15000, 15000}
	for i := range want {
		if seq[i] != want[i]*time.Millisecond {
			t.Fatalf("backoff sequence = %v, want %v ms", seq, want)
		}
	}
}
