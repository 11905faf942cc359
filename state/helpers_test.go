package state

import (
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gozt/gozt/rbac"
)

// cmpOpts compares netip values by ==.
var cmpOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// NewEndpointSet returns the set of eps, keyed by their WorkloadUID (the
// last of several with one uid wins). The store builds its own sets; this
// is for tests that build a Service by hand.
func NewEndpointSet(eps ...Endpoint) EndpointSet {
	m := make(map[string]Endpoint, len(eps))
	for _, ep := range eps {
		m[ep.WorkloadUID] = ep
	}
	return freezeEndpoints(m)
}

func vip(network, s string) NetworkAddress { return NetworkAddress{network, ip(s)} }

func cidr(network, s string) NetworkPrefix { return NetworkPrefix{network, netip.MustParsePrefix(s)} }

func pod(ns, name string, addrs ...string) *Workload {
	w := &Workload{UID: "c1//Pod/" + ns + "/" + name, Name: name, Namespace: ns}
	for _, a := range addrs {
		w.Addresses = append(w.Addresses, ip(a))
	}
	return w
}

func svc(ns, host string, vips ...NetworkAddress) *Service {
	return &Service{Name: host, Namespace: ns, Hostname: host, VIPs: vips, Ports: PortMap{80: 8080}}
}

func policy(ns, name string, scope rbac.Scope) *rbac.Policy {
	return &rbac.Policy{Name: name, Namespace: ns, Scope: scope, Action: rbac.Allow}
}

// update applies fn in one batch, failing the test on the first error that
// fn's inserts return through must.
func update(t testing.TB, s *Store, fn func(b *Batch, must func(error))) {
	t.Helper()
	s.Update(func(b *Batch) {
		fn(b, func(err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("insert: %v", err)
			}
		})
	})
}

func keys(ps []*rbac.Policy) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Key())
	}
	return out
}

func endpointUIDs(s *Service) []string {
	if s == nil {
		return nil
	}
	out := []string{}
	for uid := range s.Endpoints.UIDs() {
		out = append(out, uid)
	}
	return sorted(out)
}

func sorted(l []string) []string {
	slices.Sort(l)
	return l
}

// contents renders everything s shows (workloads, services with their
// endpoints, policies, staged endpoints) as JSON: a deep copy, for tests
// that check a snapshot never changes and for readers that walk it whole.
func contents(t testing.TB, s *Snapshot) string {
	type service struct {
		*Service
		Endpoints map[string]Endpoint // shadows Service.Endpoints, whose fields are unexported
	}
	v := struct {
		Workloads []*Workload
		Services  []service
		Policies  []*rbac.Policy
		Staged    map[string]map[string]Endpoint
	}{Workloads: s.Workloads(), Policies: s.Policies(), Staged: map[string]map[string]Endpoint{}}
	for _, svc := range s.Services() {
		v.Services = append(v.Services, service{svc, maps.Collect(svc.Endpoints.All())})
	}
	for key, eps := range s.StagedEndpoints() {
		v.Staged[key] = maps.Collect(eps.All())
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Errorf("contents: %v", err) // Errorf: readers call it off the test's goroutine
	}
	return string(data)
}
