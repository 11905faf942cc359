package configdump

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// Dump is the workloads/services/policies/stagedServices part of the admin
// /config_dump (SPEC §8.2). It encodes to the JSON that istioctl
// ztunnel-config reads and decodes back with Parse.
type Dump struct {
	Workloads      []WorkloadJSON                     `json:"workloads"`
	Services       []ServiceJSON                      `json:"services"`
	Policies       []PolicyJSON                       `json:"policies"`
	StagedServices map[string]map[string]EndpointJSON `json:"stagedServices"`
}

// WorkloadJSON is the config_dump form of a Workload. Field order follows
// ztunnel's; optional fields at their default value are omitted.
type WorkloadJSON struct {
	WorkloadIPs           []string       `json:"workloadIps"`
	Waypoint              *GatewayJSON   `json:"waypoint,omitempty"`
	NetworkGateway        *GatewayJSON   `json:"networkGateway,omitempty"`
	Protocol              string         `json:"protocol"`
	NetworkMode           string         `json:"networkMode"`
	UID                   string         `json:"uid,omitempty"`
	Name                  string         `json:"name"`
	Namespace             string         `json:"namespace"`
	TrustDomain           string         `json:"trustDomain,omitempty"`
	ServiceAccount        string         `json:"serviceAccount,omitempty"`
	Network               string         `json:"network,omitempty"`
	WorkloadName          string         `json:"workloadName,omitempty"`
	WorkloadType          string         `json:"workloadType,omitempty"`
	CanonicalName         string         `json:"canonicalName,omitempty"`
	CanonicalRevision     string         `json:"canonicalRevision,omitempty"`
	Hostname              string         `json:"hostname,omitempty"`
	Node                  string         `json:"node,omitempty"`
	NativeTunnel          bool           `json:"nativeTunnel,omitempty"`
	ApplicationTunnel     *AppTunnelJSON `json:"applicationTunnel,omitempty"`
	AuthorizationPolicies []string       `json:"authorizationPolicies,omitempty"`
	Status                string         `json:"status"`
	ClusterID             string         `json:"clusterId"`
	Locality              *LocalityJSON  `json:"locality,omitempty"`
	Services              []string       `json:"services,omitempty"`
	Capacity              uint32         `json:"capacity"`
}

// GatewayJSON is a GatewayAddress: destination "network/IP" or
// "namespace/hostname".
type GatewayJSON struct {
	Destination   string `json:"destination"`
	HBONEMTLSPort uint16 `json:"hboneMtlsPort"`
}

// AppTunnelJSON is an ApplicationTunnel: protocol "NONE" or "PROXY".
type AppTunnelJSON struct {
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port,omitempty"`
}

// LocalityJSON is a Locality.
type LocalityJSON struct {
	Region  string `json:"region"`
	Zone    string `json:"zone"`
	Subzone string `json:"subzone"`
}

// ServiceJSON is the config_dump form of a Service.
type ServiceJSON struct {
	Name              string                  `json:"name"`
	Namespace         string                  `json:"namespace"`
	Hostname          string                  `json:"hostname"`
	VIPs              []string                `json:"vips"`
	CIDRVIPs          []string                `json:"cidrVips,omitempty"`
	Ports             map[uint16]uint16       `json:"ports"`
	Endpoints         map[string]EndpointJSON `json:"endpoints"`
	SubjectAltNames   []string                `json:"subjectAltNames"`
	Waypoint          *GatewayJSON            `json:"waypoint,omitempty"`
	WeightedWaypoints []WeightedWaypointJSON  `json:"weightedWaypoints,omitempty"`
	LoadBalancer      *LoadBalancerJSON       `json:"loadBalancer,omitempty"`
	IPFamilies        string                  `json:"ipFamilies,omitempty"`
	Canonical         bool                    `json:"canonical"`
	Visibility        string                  `json:"visibility"`
}

// WeightedWaypointJSON is a WeightedWaypoint, its gateway flattened.
type WeightedWaypointJSON struct {
	Destination   string `json:"destination"`
	HBONEMTLSPort uint16 `json:"hboneMtlsPort"`
	Weight        uint32 `json:"weight"`
}

// LoadBalancerJSON is a LoadBalancer.
type LoadBalancerJSON struct {
	RoutingPreferences []string `json:"routingPreferences"`
	Mode               string   `json:"mode"`
	HealthPolicy       string   `json:"healthPolicy"`
}

// EndpointJSON is an Endpoint.
type EndpointJSON struct {
	WorkloadUID string            `json:"workloadUid"`
	Port        map[uint16]uint16 `json:"port"`
	Status      string            `json:"status"`
}

// PolicyJSON is an rbac.Policy; Rules nest rules → clauses → matches.
type PolicyJSON struct {
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Scope     string          `json:"scope"`
	Action    string          `json:"action"`
	Rules     [][][]MatchJSON `json:"rules"`
	DryRun    bool            `json:"dryRun"`
}

// MatchJSON is an rbac.Match; empty lists are omitted.
type MatchJSON struct {
	Namespaces          []StringMatchJSON         `json:"namespaces,omitempty"`
	NotNamespaces       []StringMatchJSON         `json:"notNamespaces,omitempty"`
	ServiceAccounts     []ServiceAccountMatchJSON `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []ServiceAccountMatchJSON `json:"notServiceAccounts,omitempty"`
	Principals          []StringMatchJSON         `json:"principals,omitempty"`
	NotPrincipals       []StringMatchJSON         `json:"notPrincipals,omitempty"`
	SourceIPs           []string                  `json:"sourceIps,omitempty"`
	NotSourceIPs        []string                  `json:"notSourceIps,omitempty"`
	DestinationIPs      []string                  `json:"destinationIps,omitempty"`
	NotDestinationIPs   []string                  `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint16                  `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint16                  `json:"notDestinationPorts,omitempty"`
}

// ServiceAccountMatchJSON is an rbac.ServiceAccountMatch.
type ServiceAccountMatchJSON struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// StringMatchJSON is an rbac.StringMatch, encoded as a single-key object:
// {"Exact": "v"}, {"Prefix": "v"}, {"Suffix": "v"} or {"Presence": []}.
type StringMatchJSON rbac.StringMatch

// MarshalJSON implements json.Marshaler.
func (m StringMatchJSON) MarshalJSON() ([]byte, error) {
	switch m.Kind {
	case rbac.Presence:
		return []byte(`{"Presence":[]}`), nil
	case rbac.Exact, rbac.Prefix, rbac.Suffix:
		v, err := json.Marshal(m.Value)
		if err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, `{%q:%s}`, m.Kind.String(), v), nil
	}
	return nil, fmt.Errorf("state: unknown string match kind %d", m.Kind)
}

// UnmarshalJSON implements json.Unmarshaler.
func (m *StringMatchJSON) UnmarshalJSON(data []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return err
	}
	if len(obj) != 1 {
		return errors.New("string match must have exactly one of Exact, Prefix, Suffix, Presence")
	}
	for k, raw := range obj {
		kind, ok := parseEnum(k, rbac.Presence)
		if !ok {
			return fmt.Errorf("unknown string match %q", k)
		}
		if kind == rbac.Presence {
			*m = StringMatchJSON{Kind: rbac.Presence}
			return nil
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		*m = StringMatchJSON{Kind: kind, Value: v}
	}
	return nil
}

// parseEnum returns the value of T in [0, last] whose String() is s.
func parseEnum[T interface {
	~uint8
	String() string
}](s string, last T) (T, bool) {
	for v := T(0); v <= last; v++ {
		if v.String() == s {
			return v, true
		}
	}
	return 0, false
}

// FromSnapshot returns the config_dump form of s: workloads sorted by
// uid, services by hostname then namespace, policies by key.
func FromSnapshot(s *state.Snapshot) Dump {
	d := Dump{
		Workloads:      []WorkloadJSON{},
		Services:       []ServiceJSON{},
		Policies:       []PolicyJSON{},
		StagedServices: map[string]map[string]EndpointJSON{},
	}
	for _, w := range s.Workloads() {
		d.Workloads = append(d.Workloads, NewWorkloadJSON(w))
	}
	for _, svc := range s.Services() {
		d.Services = append(d.Services, NewServiceJSON(svc))
	}
	for _, p := range s.Policies() {
		d.Policies = append(d.Policies, NewPolicyJSON(p))
	}
	for key, eps := range s.StagedEndpoints() {
		d.StagedServices[key] = endpointsJSON(eps)
	}
	return d
}

// NewWorkloadJSON returns the config_dump form of w.
func NewWorkloadJSON(w *state.Workload) WorkloadJSON {
	j := WorkloadJSON{
		WorkloadIPs:           make([]string, 0, len(w.Addresses)),
		Waypoint:              gatewayJSON(w.Waypoint),
		NetworkGateway:        gatewayJSON(w.NetworkGateway),
		Protocol:              w.Protocol.String(),
		NetworkMode:           w.NetworkMode.String(),
		UID:                   w.UID,
		Name:                  w.Name,
		Namespace:             w.Namespace,
		TrustDomain:           w.TrustDomain,
		ServiceAccount:        w.ServiceAccount,
		Network:               w.Network,
		WorkloadName:          w.WorkloadName,
		WorkloadType:          w.WorkloadType.String(),
		CanonicalName:         w.CanonicalName,
		CanonicalRevision:     w.CanonicalRevision,
		Hostname:              w.Hostname,
		Node:                  w.Node,
		NativeTunnel:          w.NativeTunnel,
		AuthorizationPolicies: w.AuthorizationPolicies,
		Status:                w.Status.String(),
		ClusterID:             w.ClusterID,
		Capacity:              w.Weight(),
	}
	for _, a := range w.Addresses {
		j.WorkloadIPs = append(j.WorkloadIPs, a.String())
	}
	if t := w.ApplicationTunnel; t != nil {
		j.ApplicationTunnel = &AppTunnelJSON{Protocol: t.Protocol.String(), Port: t.Port}
	}
	if !w.Locality.IsZero() {
		j.Locality = &LocalityJSON{w.Locality.Region, w.Locality.Zone, w.Locality.Subzone}
	}
	if len(w.Services) > 0 {
		j.Services = slices.Sorted(maps.Keys(w.Services))
	}
	return j
}

func gatewayJSON(g *state.GatewayAddress) *GatewayJSON {
	if g == nil {
		return nil
	}
	return &GatewayJSON{Destination: g.Destination(), HBONEMTLSPort: g.HBONEMTLSPort}
}

// NewServiceJSON returns the config_dump form of svc, endpoints included.
func NewServiceJSON(svc *state.Service) ServiceJSON {
	j := ServiceJSON{
		Name:            svc.Name,
		Namespace:       svc.Namespace,
		Hostname:        svc.Hostname,
		VIPs:            make([]string, 0, len(svc.VIPs)),
		Ports:           map[uint16]uint16{},
		Endpoints:       endpointsJSON(svc.Endpoints),
		SubjectAltNames: []string{},
		Waypoint:        gatewayJSON(svc.Waypoint),
		Canonical:       svc.Canonical,
		Visibility:      svc.Visibility.String(),
	}
	for _, v := range svc.VIPs {
		j.VIPs = append(j.VIPs, v.String())
	}
	for _, p := range svc.CIDRVIPs {
		j.CIDRVIPs = append(j.CIDRVIPs, p.String())
	}
	maps.Copy(j.Ports, svc.Ports)
	j.SubjectAltNames = append(j.SubjectAltNames, svc.SubjectAltNames...)
	for _, ww := range svc.WeightedWaypoints {
		j.WeightedWaypoints = append(j.WeightedWaypoints, WeightedWaypointJSON{
			Destination: ww.Destination.Destination(), HBONEMTLSPort: ww.Destination.HBONEMTLSPort, Weight: ww.Weight,
		})
	}
	if lb := svc.LoadBalancer; lb != nil {
		l := &LoadBalancerJSON{RoutingPreferences: []string{}, Mode: lb.Mode.String(), HealthPolicy: lb.HealthPolicy.String()}
		for _, sc := range lb.RoutingPreference {
			l.RoutingPreferences = append(l.RoutingPreferences, sc.String())
		}
		j.LoadBalancer = l
	}
	if svc.IPFamilies != state.FamiliesAutomatic {
		j.IPFamilies = svc.IPFamilies.String()
	}
	return j
}

func endpointsJSON(eps state.EndpointSet) map[string]EndpointJSON {
	out := make(map[string]EndpointJSON, eps.Len())
	for uid, ep := range eps.All() {
		ports := make(map[uint16]uint16, len(ep.Ports))
		maps.Copy(ports, ep.Ports)
		out[uid] = EndpointJSON{WorkloadUID: ep.WorkloadUID, Port: ports, Status: ep.Status.String()}
	}
	return out
}

// NewPolicyJSON returns the config_dump form of p.
func NewPolicyJSON(p *rbac.Policy) PolicyJSON {
	j := PolicyJSON{
		Name:      p.Name,
		Namespace: p.Namespace,
		Scope:     p.Scope.String(),
		Action:    p.Action.String(),
		Rules:     make([][][]MatchJSON, 0, len(p.Rules)),
		DryRun:    p.DryRun,
	}
	for _, r := range p.Rules {
		clauses := make([][]MatchJSON, 0, len(r.Clauses))
		for _, c := range r.Clauses {
			matches := make([]MatchJSON, 0, len(c.Matches))
			for i := range c.Matches {
				matches = append(matches, matchJSON(&c.Matches[i]))
			}
			clauses = append(clauses, matches)
		}
		j.Rules = append(j.Rules, clauses)
	}
	return j
}

func matchJSON(m *rbac.Match) MatchJSON {
	return MatchJSON{
		Namespaces:          stringMatchesJSON(m.Namespaces),
		NotNamespaces:       stringMatchesJSON(m.NotNamespaces),
		ServiceAccounts:     serviceAccountsJSON(m.ServiceAccounts),
		NotServiceAccounts:  serviceAccountsJSON(m.NotServiceAccounts),
		Principals:          stringMatchesJSON(m.Principals),
		NotPrincipals:       stringMatchesJSON(m.NotPrincipals),
		SourceIPs:           prefixesJSON(m.SourceIPs),
		NotSourceIPs:        prefixesJSON(m.NotSourceIPs),
		DestinationIPs:      prefixesJSON(m.DestinationIPs),
		NotDestinationIPs:   prefixesJSON(m.NotDestinationIPs),
		DestinationPorts:    slices.Clone(m.DestinationPorts),
		NotDestinationPorts: slices.Clone(m.NotDestinationPorts),
	}
}

func stringMatchesJSON(l []rbac.StringMatch) []StringMatchJSON {
	if len(l) == 0 {
		return nil
	}
	out := make([]StringMatchJSON, len(l))
	for i, m := range l {
		out[i] = StringMatchJSON(m)
	}
	return out
}

func serviceAccountsJSON(l []rbac.ServiceAccountMatch) []ServiceAccountMatchJSON {
	if len(l) == 0 {
		return nil
	}
	out := make([]ServiceAccountMatchJSON, len(l))
	for i, m := range l {
		out[i] = ServiceAccountMatchJSON(m)
	}
	return out
}

func prefixesJSON(l []netip.Prefix) []string {
	if len(l) == 0 {
		return nil
	}
	out := make([]string, len(l))
	for i, p := range l {
		out[i] = p.String()
	}
	return out
}
