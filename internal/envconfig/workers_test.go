package envconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestWorkerCount follows SPEC §0.1's rules for the worker thread count.
func TestWorkerCount(t *testing.T) {
	for _, tc := range []struct {
		env    []string
		numCPU int
		want   int
	}{
		{nil, 2, 2},   // max(ceil(25% of 2), 2)
		{nil, 1, 2},   // at least 2 without a limit
		{nil, 64, 16}, // 25% of a big node
		{nil, 13, 4},  // rounded up
		{[]string{"ZTUNNEL_RESOURCE_CPU_REQUEST=5"}, 8, 5},
		{[]string{"ZTUNNEL_RESOURCE_CPU_LIMIT=500m"}, 64, 1},
		{[]string{"ZTUNNEL_RESOURCE_CPU_LIMIT=1.5"}, 64, 2},
		{[]string{"ZTUNNEL_RESOURCE_CPU_LIMIT=2", "ZTUNNEL_RESOURCE_CPU_REQUEST=3"}, 64, 3},
		{[]string{"ZTUNNEL_CPU_LIMIT=40"}, 64, 10},
		{[]string{"ZTUNNEL_WORKER_THREADS=3"}, 64, 3},
		{[]string{"ZTUNNEL_WORKER_THREADS=0"}, 64, 64},
		{[]string{"ZTUNNEL_WORKER_THREADS=0", "ZTUNNEL_RESOURCE_CPU_LIMIT=4"}, 64, 4},
		{[]string{"ZTUNNEL_WORKER_THREADS=50%"}, 7, 4},
		{[]string{"ZTUNNEL_WORKER_THREADS=50%", "ZTUNNEL_CPU_LIMIT=10"}, 64, 5},
		{[]string{"ZTUNNEL_WORKER_THREADS=1%"}, 4, 1},
	} {
		c, err := Load(tc.env)
		if err != nil {
			t.Fatalf("Load(%q): %v", tc.env, err)
		}
		if got := c.Workers.Count(tc.numCPU); got != tc.want {
			t.Errorf("%q on %d CPUs: %d worker threads, want %d", tc.env, tc.numCPU, got, tc.want)
		}
	}
}

func TestWorkerBadValues(t *testing.T) {
	for _, kv := range []string{
		"ZTUNNEL_WORKER_THREADS=-1", "ZTUNNEL_WORKER_THREADS=0%", "ZTUNNEL_WORKER_THREADS=many",
		"ZTUNNEL_RESOURCE_CPU_LIMIT=0", "ZTUNNEL_RESOURCE_CPU_LIMIT=2 cores", "ZTUNNEL_RESOURCE_CPU_REQUEST=-1m",
		"ZTUNNEL_CPU_LIMIT=NaN", "ZTUNNEL_CPU_LIMIT=Inf",
	} {
		name, _, _ := strings.Cut(kv, "=")
		_, err := Load([]string{kv})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), name+":") {
			t.Errorf("Load(%q) error = %v, want one naming %s", kv, err, name)
		}
	}
}
