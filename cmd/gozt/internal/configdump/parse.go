package configdump

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// Parse decodes config_dump JSON (the whole document or just these four
// keys); other top-level keys and unknown fields are ignored.
func Parse(data []byte) (*Dump, error) {
	var d Dump
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("state: parse config dump: %w", err)
	}
	return &d, nil
}

// State converts the dump back into store values. Each workload's Services
// map is rebuilt from the endpoints of the dumped services and staged
// services; for an unhealthy endpoint that a service filtered out (health
// policy OnlyHealthy) only the membership is known, so its port map comes
// back empty.
func (d *Dump) State() (workloads []*state.Workload, services []*state.Service, policies []*rbac.Policy, err error) {
	byUID := map[string]*state.Workload{}
	for i := range d.Workloads {
		w, err := d.Workloads[i].Workload()
		if err != nil {
			return nil, nil, nil, err
		}
		w.Services = nil
		byUID[w.UID] = w
		workloads = append(workloads, w)
	}
	attach := func(key string, eps map[string]EndpointJSON) {
		for uid, ep := range eps {
			if w := byUID[uid]; w != nil {
				if w.Services == nil {
					w.Services = map[string]state.PortMap{}
				}
				w.Services[key] = state.PortMap(maps.Clone(ep.Port))
				if w.Services[key] == nil {
					w.Services[key] = state.PortMap{}
				}
			}
		}
	}
	for i := range d.Services {
		s, err := d.Services[i].Service()
		if err != nil {
			return nil, nil, nil, err
		}
		services = append(services, s)
		attach(s.Key(), d.Services[i].Endpoints)
	}
	for _, key := range slices.Sorted(maps.Keys(d.StagedServices)) {
		attach(key, d.StagedServices[key])
	}
	// A membership whose endpoint the service filtered out (unhealthy)
	// keeps its key, without ports.
	for i := range d.Workloads {
		w := byUID[d.Workloads[i].UID]
		for _, key := range d.Workloads[i].Services {
			if _, ok := w.Services[key]; !ok {
				if w.Services == nil {
					w.Services = map[string]state.PortMap{}
				}
				w.Services[key] = state.PortMap{}
			}
		}
	}
	for i := range d.Policies {
		p, err := d.Policies[i].Policy()
		if err != nil {
			return nil, nil, nil, err
		}
		policies = append(policies, p)
	}
	return workloads, services, policies, nil
}

// Apply resets the batch and inserts everything in the dump.
func (d *Dump) Apply(b *state.Batch) error {
	ws, ss, ps, err := d.State()
	if err != nil {
		return err
	}
	b.Reset()
	var errs []error
	for _, w := range ws {
		errs = append(errs, b.InsertWorkload(w))
	}
	for _, s := range ss {
		errs = append(errs, b.InsertService(s))
	}
	for _, p := range ps {
		errs = append(errs, b.InsertPolicy(p))
	}
	return errors.Join(errs...)
}

func dumpErr(what, id, field string, err error) error {
	return fmt.Errorf("state: %s %s: %s: %w", what, id, field, err)
}

func enumErr[T interface {
	~uint8
	String() string
}](s string, last T) error {
	var names []string
	for v := T(0); v <= last; v++ {
		names = append(names, v.String())
	}
	return fmt.Errorf("unknown value %q (want one of %s)", s, strings.Join(names, ", "))
}

// parseField parses an enum spelled s (empty means the zero value).
func parseField[T interface {
	~uint8
	String() string
}](s string, last T) (T, error) {
	if s == "" {
		return 0, nil
	}
	v, ok := parseEnum(s, last)
	if !ok {
		return 0, enumErr(s, last)
	}
	return v, nil
}

// Workload converts j back to a Workload (Services left nil: see
// Dump.State). A capacity of 1 becomes 0, its equivalent default.
func (j *WorkloadJSON) Workload() (*state.Workload, error) {
	w := &state.Workload{
		UID: j.UID, Name: j.Name, Namespace: j.Namespace, Hostname: j.Hostname, Network: j.Network,
		TrustDomain: j.TrustDomain, ServiceAccount: j.ServiceAccount, Node: j.Node,
		CanonicalName: j.CanonicalName, CanonicalRevision: j.CanonicalRevision,
		WorkloadName: j.WorkloadName, NativeTunnel: j.NativeTunnel,
		AuthorizationPolicies: j.AuthorizationPolicies, ClusterID: j.ClusterID,
	}
	if j.Capacity > 1 {
		w.Capacity = j.Capacity
	}
	fail := func(field string, err error) (*state.Workload, error) {
		return nil, dumpErr("workload", cmp.Or(j.UID, j.Namespace+"/"+j.Name), field, err)
	}
	var err error
	if w.Protocol, err = parseField(j.Protocol, state.TunnelHBONE); err != nil {
		return fail("protocol", err)
	}
	if w.NetworkMode, err = parseField(j.NetworkMode, state.NetworkHost); err != nil {
		return fail("networkMode", err)
	}
	if w.WorkloadType, err = parseField(j.WorkloadType, state.WorkloadJob); err != nil {
		return fail("workloadType", err)
	}
	if w.Status, err = parseField(j.Status, state.StatusUnhealthy); err != nil {
		return fail("status", err)
	}
	for _, s := range j.WorkloadIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fail("workloadIps", err)
		}
		w.Addresses = append(w.Addresses, a.Unmap())
	}
	if w.Waypoint, err = j.Waypoint.gateway(); err != nil {
		return fail("waypoint", err)
	}
	if w.NetworkGateway, err = j.NetworkGateway.gateway(); err != nil {
		return fail("networkGateway", err)
	}
	if t := j.ApplicationTunnel; t != nil {
		p, err := parseField(t.Protocol, state.AppTunnelProxy)
		if err != nil {
			return fail("applicationTunnel.protocol", err)
		}
		w.ApplicationTunnel = &state.ApplicationTunnel{Protocol: p, Port: t.Port}
	}
	if l := j.Locality; l != nil {
		w.Locality = state.Locality{Region: l.Region, Zone: l.Zone, Subzone: l.Subzone}
	}
	return w, nil
}

func (g *GatewayJSON) gateway() (*state.GatewayAddress, error) {
	if g == nil {
		return nil, nil
	}
	return state.ParseGatewayDestination(g.Destination, g.HBONEMTLSPort)
}

// Service converts j back to a Service (Endpoints left nil: the store builds
// them from workloads).
func (j *ServiceJSON) Service() (*state.Service, error) {
	s := &state.Service{
		Name: j.Name, Namespace: j.Namespace, Hostname: j.Hostname,
		Canonical: j.Canonical,
	}
	if len(j.SubjectAltNames) > 0 {
		s.SubjectAltNames = j.SubjectAltNames
	}
	fail := func(field string, err error) (*state.Service, error) {
		return nil, dumpErr("service", j.Namespace+"/"+j.Hostname, field, err)
	}
	for _, v := range j.VIPs {
		a, err := state.ParseNetworkAddress(v)
		if err != nil {
			return fail("vips", err)
		}
		s.VIPs = append(s.VIPs, a)
	}
	for _, v := range j.CIDRVIPs {
		p, err := state.ParseNetworkPrefix(v)
		if err != nil {
			return fail("cidrVips", err)
		}
		s.CIDRVIPs = append(s.CIDRVIPs, p)
	}
	if len(j.Ports) > 0 {
		s.Ports = state.PortMap(maps.Clone(j.Ports))
	}
	var err error
	if s.Waypoint, err = j.Waypoint.gateway(); err != nil {
		return fail("waypoint", err)
	}
	for _, ww := range j.WeightedWaypoints {
		g, err := state.ParseGatewayDestination(ww.Destination, ww.HBONEMTLSPort)
		if err != nil {
			return fail("weightedWaypoints", err)
		}
		s.WeightedWaypoints = append(s.WeightedWaypoints, state.WeightedWaypoint{Destination: *g, Weight: ww.Weight})
	}
	if s.LoadBalancer, err = j.LoadBalancer.loadBalancer(); err != nil {
		return fail("loadBalancer", err)
	}
	if j.IPFamilies != "" {
		f, ok := parseEnum(j.IPFamilies, state.FamiliesDual)
		if !ok || f == state.FamiliesAutomatic {
			return fail("ipFamilies", fmt.Errorf("unknown value %q (want one of Dual, IPv4, IPv6)", j.IPFamilies))
		}
		s.IPFamilies = f
	}
	if s.Visibility, err = parseField(j.Visibility, state.VisibilityNamespace); err != nil {
		return fail("visibility", err)
	}
	return s, nil
}

func (l *LoadBalancerJSON) loadBalancer() (*state.LoadBalancer, error) {
	if l == nil {
		return nil, nil
	}
	lb := &state.LoadBalancer{}
	for _, p := range l.RoutingPreferences {
		sc, ok := parseEnum(p, state.ScopeNetwork)
		if !ok || sc == 0 {
			return nil, fmt.Errorf("unknown routing preference %q", p)
		}
		lb.RoutingPreference = append(lb.RoutingPreference, sc)
	}
	var err error
	if lb.Mode, err = parseField(l.Mode, state.LBPassthrough); err != nil {
		return nil, err
	}
	if lb.HealthPolicy, err = parseField(l.HealthPolicy, state.AllowAll); err != nil {
		return nil, err
	}
	return lb, nil
}

// Policy converts j back to an rbac.Policy.
func (j *PolicyJSON) Policy() (*rbac.Policy, error) {
	p := &rbac.Policy{Name: j.Name, Namespace: j.Namespace, DryRun: j.DryRun}
	fail := func(field string, err error) (*rbac.Policy, error) {
		return nil, dumpErr("policy", j.Namespace+"/"+j.Name, field, err)
	}
	var err error
	if p.Scope, err = parseField(j.Scope, rbac.WorkloadSelector); err != nil {
		return fail("scope", err)
	}
	if p.Action, err = parseField(j.Action, rbac.Deny); err != nil {
		return fail("action", err)
	}
	for _, r := range j.Rules {
		var rule rbac.Rule
		for _, c := range r {
			var clause rbac.Clause
			for i := range c {
				m, err := c[i].match()
				if err != nil {
					return fail("rules", err)
				}
				clause.Matches = append(clause.Matches, m)
			}
			rule.Clauses = append(rule.Clauses, clause)
		}
		p.Rules = append(p.Rules, rule)
	}
	return p, nil
}

func (j *MatchJSON) match() (rbac.Match, error) {
	m := rbac.Match{
		Namespaces:          stringMatches(j.Namespaces),
		NotNamespaces:       stringMatches(j.NotNamespaces),
		ServiceAccounts:     serviceAccounts(j.ServiceAccounts),
		NotServiceAccounts:  serviceAccounts(j.NotServiceAccounts),
		Principals:          stringMatches(j.Principals),
		NotPrincipals:       stringMatches(j.NotPrincipals),
		DestinationPorts:    slices.Clone(j.DestinationPorts),
		NotDestinationPorts: slices.Clone(j.NotDestinationPorts),
	}
	var err error
	for _, f := range []struct {
		dst *[]netip.Prefix
		src []string
	}{
		{&m.SourceIPs, j.SourceIPs}, {&m.NotSourceIPs, j.NotSourceIPs},
		{&m.DestinationIPs, j.DestinationIPs}, {&m.NotDestinationIPs, j.NotDestinationIPs},
	} {
		if *f.dst, err = state.ParsePrefixes(f.src); err != nil {
			return rbac.Match{}, err
		}
	}
	return m, nil
}

func stringMatches(l []StringMatchJSON) []rbac.StringMatch {
	if len(l) == 0 {
		return nil
	}
	out := make([]rbac.StringMatch, len(l))
	for i, m := range l {
		out[i] = rbac.StringMatch(m)
	}
	return out
}

func serviceAccounts(l []ServiceAccountMatchJSON) []rbac.ServiceAccountMatch {
	if len(l) == 0 {
		return nil
	}
	out := make([]rbac.ServiceAccountMatch, len(l))
	for i, m := range l {
		out[i] = rbac.ServiceAccountMatch(m)
	}
	return out
}
