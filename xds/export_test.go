package xds

import (
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// Converters without an interner, for the tests (the client converts
// through addressFromProto with one).

// AddressFromProto converts an istio.workload.Address, which carries either
// a workload or a service: exactly one of w and s is non-nil when err is nil.
func AddressFromProto(a *workloadapi.Address) (w *state.Workload, s *state.Service, err error) {
	return addressFromProto(a, nil)
}

// WorkloadFromProto converts an istio.workload.Workload as the client does
// (see workloadFromProtoIn), sharing no strings with other workloads.
func WorkloadFromProto(p *workloadapi.Workload) (*state.Workload, error) {
	return workloadFromProtoIn(p, nil)
}

// DemandWaiters returns how many Demand calls wait for key's pending
// answer (0 when none is pending).
func DemandWaiters(c *Client, key string) int {
	c.demands.mu.Lock()
	defer c.demands.mu.Unlock()
	if w, ok := c.demands.pending[key]; ok {
		return w.waiters
	}
	return 0
}

// DemandSets returns how many names the client keeps subscribed for
// reconnects and on the current stream.
func DemandSets(c *Client) (subscribed, onStream int) {
	c.demands.mu.Lock()
	defer c.demands.mu.Unlock()
	return len(c.demands.subscribed), len(c.demands.onStream)
}
