package envconfig

import (
	"math"
	"strconv"
	"strings"
)

// Workers is what decides ztunnel's data-plane worker thread count (SPEC
// §0.1), which gozt uses as GOMAXPROCS: a node proxy that runs on every node
// should not spread over every core of a large one (each idle P that spins
// looking for work costs CPU on every connection hand-off).
type Workers struct {
	Threads    string `json:"workerThreads"`    // ZTUNNEL_WORKER_THREADS: "", "N", "N%", or "0" (all CPUs)
	CPULimit   string `json:"resourceCPULimit"` // ZTUNNEL_RESOURCE_CPU_LIMIT, a Kubernetes quantity
	CPURequest string `json:"resourceCPURequest"`
	CPUCount   string `json:"cpuLimit"` // ZTUNNEL_CPU_LIMIT
	// Concurrency is ProxyConfig's concurrency, or nil if unset.
	Concurrency *uint16 `json:"concurrency,omitempty"`
}

// loadWorkers reads and checks the worker variables.
func loadWorkers(l *loader) Workers {
	w := Workers{
		Threads:    l.str("ZTUNNEL_WORKER_THREADS", ""),
		CPULimit:   l.str("ZTUNNEL_RESOURCE_CPU_LIMIT", ""),
		CPURequest: l.str("ZTUNNEL_RESOURCE_CPU_REQUEST", ""),
		CPUCount:   l.str("ZTUNNEL_CPU_LIMIT", ""),
	}
	if w.Threads != "" {
		if _, _, ok := parseThreads(w.Threads); !ok {
			l.fail("ZTUNNEL_WORKER_THREADS", "want a thread count, a percentage like 50%%, or 0 for all CPUs: %q", w.Threads)
		}
	}
	for _, q := range [...]struct{ name, v string }{
		{"ZTUNNEL_RESOURCE_CPU_LIMIT", w.CPULimit},
		{"ZTUNNEL_RESOURCE_CPU_REQUEST", w.CPURequest},
		{"ZTUNNEL_CPU_LIMIT", w.CPUCount},
	} {
		if _, ok := cpuQuantity(q.v); q.v != "" && !ok {
			l.fail(q.name, "not a CPU quantity like 2, 1.5 or 500m: %q", q.v)
		}
	}
	return w
}

// Count returns the worker thread count for a machine with numCPU logical
// CPUs: ZTUNNEL_WORKER_THREADS if set (N, N% of the CPU count rounded up, or
// 0 for all of them); otherwise ProxyConfig's concurrency if set (0 for all
// CPUs); otherwise the CPU limit rounded up and raised to the request, or
// with no limit max(ceil(25% of the CPU count), request, 2). The CPU count
// is the resource limit, else ZTUNNEL_CPU_LIMIT, else numCPU. The result is
// at least 1.
func (w Workers) Count(numCPU int) int {
	cpus := numCPU
	limit, hasLimit := cpuQuantity(w.CPULimit)
	request, _ := cpuQuantity(w.CPURequest)
	if hasLimit {
		cpus = limit
	} else if n, ok := cpuQuantity(w.CPUCount); ok {
		cpus = n
	}
	var n int
	switch count, pct, ok := parseThreads(w.Threads); {
	case ok && pct:
		n = int(math.Ceil(float64(cpus) * float64(count) / 100))
	case ok && count == 0:
		n = cpus
	case ok:
		n = count
	case w.Concurrency != nil && *w.Concurrency > 0:
		n = int(*w.Concurrency)
	case w.Concurrency != nil:
		n = cpus
	case hasLimit:
		n = max(limit, request)
	default:
		n = max(int(math.Ceil(float64(cpus)*0.25)), request, 2)
	}
	return max(n, 1)
}

// parseThreads parses ZTUNNEL_WORKER_THREADS: a count, or a percentage.
func parseThreads(v string) (n int, pct, ok bool) {
	if v == "" {
		return 0, false, false
	}
	s, pct := strings.CutSuffix(v, "%")
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || (pct && n == 0) {
		return 0, false, false
	}
	return n, pct, true
}

// cpuQuantity parses a Kubernetes CPU quantity ("2", "1.5", "500m") and
// rounds it up to whole CPUs.
func cpuQuantity(v string) (int, bool) {
	if v == "" {
		return 0, false
	}
	scale := 1.0
	if s, ok := strings.CutSuffix(v, "m"); ok {
		v, scale = s, 1000
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) || f/scale > 1<<20 {
		return 0, false
	}
	return int(math.Ceil(f / scale)), true
}
