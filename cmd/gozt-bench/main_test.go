package main

import (
	"slices"
	"testing"
)

// TestBenchArgs checks that the harness's re-run of itself, `<exe> bench
// --role NAME ...`, reaches bench.Run as `--role NAME ...`, and that a
// user's flags pass through unchanged.
func TestBenchArgs(t *testing.T) {
	for _, tc := range []struct {
		args, want []string
	}{
		{args: nil, want: nil},
		{args: []string{"--quick", "--scenario", "connect"}, want: []string{"--quick", "--scenario", "connect"}},
		{args: []string{"bench", "--role", "gozt", "--x"}, want: []string{"--role", "gozt", "--x"}},
		{args: []string{"--scenario", "bench"}, want: []string{"--scenario", "bench"}},
	} {
		if got := benchArgs(tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("benchArgs(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
