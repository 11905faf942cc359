package xds

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// cmpNetip compares netip values by ==.
var cmpNetip = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func ip4(a, b, c, d byte) []byte { return []byte{a, b, c, d} }

func u32(v uint32) *uint32 { return &v }

func TestWorkloadFromProto(t *testing.T) {
	v6 := netip.MustParseAddr("fd00::1")
	full := &workloadapi.Workload{
		Uid:               "c1//Pod/ns/a",
		Name:              "a",
		Namespace:         "ns",
		Addresses:         [][]byte{ip4(10, 0, 0, 1), v6.AsSlice()},
		Hostname:          "a.example",
		Network:           "net1",
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		TrustDomain:       "td",
		ServiceAccount:    "sa",
		Waypoint:          &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp"}}, HboneMtlsPort: 15008},
		NetworkGateway:    &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: "n2", Address: ip4(1, 2, 3, 4), Length: u32(32)}}, HboneMtlsPort: 15009},
		Node:              "node1",
		CanonicalName:     "cn",
		CanonicalRevision: "cr",
		WorkloadType:      workloadapi.WorkloadType_POD,
		WorkloadName:      "wn",
		NativeTunnel:      true,
		ApplicationTunnel: &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088},
		Services: map[string]*workloadapi.PortList{
			"ns/svc.example": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 443}}},
			"ns/empty":       {},
		},
		AuthorizationPolicies: []string{"ns/p1"},
		Status:                workloadapi.WorkloadStatus_UNHEALTHY,
		ClusterId:             "c1",
		Locality:              &workloadapi.Locality{Region: "r", Zone: "z", Subzone: "s"},
		NetworkMode:           workloadapi.NetworkMode_HOST_NETWORK,
		Capacity:              wrapperspb.UInt32(7),
	}
	fullWant := &state.Workload{
		UID: "c1//Pod/ns/a", Name: "a", Namespace: "ns",
		Addresses:         []netip.Addr{netip.MustParseAddr("10.0.0.1"), v6},
		Hostname:          "a.example",
		Network:           "net1",
		Protocol:          state.TunnelHBONE,
		TrustDomain:       "td",
		ServiceAccount:    "sa",
		Waypoint:          &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp"}, HBONEMTLSPort: 15008},
		NetworkGateway:    &state.GatewayAddress{Address: &state.NetworkAddress{Network: "n2", Address: netip.MustParseAddr("1.2.3.4")}, HBONEMTLSPort: 15009},
		Node:              "node1",
		CanonicalName:     "cn",
		CanonicalRevision: "cr",
		WorkloadType:      state.WorkloadPod,
		WorkloadName:      "wn",
		NativeTunnel:      true,
		ApplicationTunnel: &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088},
		Services: map[string]state.PortMap{
			"ns/svc.example": {80: 8080, 443: 0},
			"ns/empty":       nil,
		},
		AuthorizationPolicies: []string{"ns/p1"},
		Status:                state.StatusUnhealthy,
		ClusterID:             "c1",
		Locality:              state.Locality{Region: "r", Zone: "z", Subzone: "s"},
		NetworkMode:           state.NetworkHost,
		Capacity:              7,
	}
	tests := []struct {
		name string
		in   *workloadapi.Workload
		want *state.Workload
	}{
		{"full", full, fullWant},
		{
			name: "defaults",
			in:   &workloadapi.Workload{Uid: "u", Name: "a", Namespace: "ns"},
			want: &state.Workload{
				UID: "u", Name: "a", Namespace: "ns",
				TrustDomain: "cluster.local", ServiceAccount: "default", ClusterID: "Kubernetes", Capacity: 1,
			},
		},
		{
			name: "explicit zero capacity is kept",
			in:   &workloadapi.Workload{Uid: "u", Capacity: wrapperspb.UInt32(0)},
			want: &state.Workload{
				UID: "u", TrustDomain: "cluster.local", ServiceAccount: "default", ClusterID: "Kubernetes",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WorkloadFromProto(tt.in)
			if err != nil {
				t.Fatalf("WorkloadFromProto: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpNetip); diff != "" {
				t.Errorf("WorkloadFromProto mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWorkloadFromProtoRejects covers TESTPLAN bad input 39 and the
// rejections of SPEC §5.4.
func TestWorkloadFromProtoRejects(t *testing.T) {
	ok := func(mod func(w *workloadapi.Workload)) *workloadapi.Workload {
		w := &workloadapi.Workload{Uid: "u", Name: "a", Namespace: "ns"}
		mod(w)
		return w
	}
	tests := []struct {
		name string
		in   *workloadapi.Workload
		want string // substring of the error
	}{
		{"nil", nil, "nil"},
		{"empty uid", ok(func(w *workloadapi.Workload) { w.Uid = "" }), "empty uid"},
		{"5-byte ip", ok(func(w *workloadapi.Workload) { w.Addresses = [][]byte{{1, 2, 3, 4, 5}} }), "addresses[0]: address of 5 bytes"},
		{"empty ip", ok(func(w *workloadapi.Workload) { w.Addresses = [][]byte{{}} }), "address of 0 bytes"},
		{"legacy mtls", ok(func(w *workloadapi.Workload) { w.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS }), "LEGACY_ISTIO_MTLS"},
		{"unknown tunnel", ok(func(w *workloadapi.Workload) { w.TunnelProtocol = 9 }), "unknown tunnel_protocol 9"},
		{"unknown workload type", ok(func(w *workloadapi.Workload) { w.WorkloadType = 4 }), "unknown workload_type"},
		{"unknown status", ok(func(w *workloadapi.Workload) { w.Status = 2 }), "unknown status"},
		{"unknown network mode", ok(func(w *workloadapi.Workload) { w.NetworkMode = -1 }), "unknown network_mode"},
		{"service port 70000", ok(func(w *workloadapi.Workload) {
			w.Services = map[string]*workloadapi.PortList{"ns/s": {Ports: []*workloadapi.Port{{ServicePort: 70000, TargetPort: 80}}}}
		}), "port 70000 out of range"},
		{"target port 70000", ok(func(w *workloadapi.Workload) {
			w.Services = map[string]*workloadapi.PortList{"ns/s": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 70000}}}}
		}), "target_port: port 70000"},
		{"bad service key", ok(func(w *workloadapi.Workload) {
			w.Services = map[string]*workloadapi.PortList{"noslash": {}}
		}), "not namespace/hostname"},
		{"app tunnel port", ok(func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Port: 70000}
		}), "application_tunnel: port 70000"},
		{"app tunnel protocol", ok(func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: 5}
		}), "unknown protocol 5"},
		{"waypoint without destination", ok(func(w *workloadapi.Workload) {
			w.Waypoint = &workloadapi.GatewayAddress{HboneMtlsPort: 15008}
		}), "waypoint: no destination"},
		{"waypoint port", ok(func(w *workloadapi.Workload) {
			w.Waypoint = &workloadapi.GatewayAddress{HboneMtlsPort: 1 << 20, Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "a", Hostname: "b"}}}
		}), "hbone_mtls_port"},
		{"waypoint empty hostname", ok(func(w *workloadapi.Workload) {
			w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "a"}}}
		}), "without namespace or hostname"},
		{"gateway bad ip", ok(func(w *workloadapi.Workload) {
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: []byte{1}}}}
		}), "network_gateway: address of 1 bytes"},
		{"gateway cidr", ok(func(w *workloadapi.Workload) {
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: ip4(1, 2, 3, 0), Length: u32(24)}}}
		}), "prefix length 24 on a host address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WorkloadFromProto(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("WorkloadFromProto = %+v, %v; want error containing %q", got, err, tt.want)
			}
			if got != nil {
				t.Errorf("WorkloadFromProto returned a workload with error %v", err)
			}
		})
	}
}

func TestServiceFromProto(t *testing.T) {
	in := &workloadapi.Service{
		Name: "svc", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{
			{Network: "", Address: ip4(10, 96, 0, 1)},
			{Network: "n", Address: ip4(10, 96, 0, 2), Length: u32(32)},
			{Network: "n", Address: ip4(10, 97, 0, 0), Length: u32(16)},
			{Address: netip.MustParseAddr("fd00::").AsSlice(), Length: u32(64)},
		},
		Ports:           []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 80, TargetPort: 9090}},
		SubjectAltNames: []string{"spiffe://td/ns/ns/sa/x"},
		Waypoint:        &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp"}}, HboneMtlsPort: 15008},
		LoadBalancing: &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION},
			Mode:              workloadapi.LoadBalancing_FAILOVER,
			HealthPolicy:      workloadapi.LoadBalancing_ALLOW_ALL,
		},
		IpFamilies: workloadapi.IPFamilies_DUAL,
		Canonical:  true,
		WeightedWaypoints: []*workloadapi.WeightedWaypoint{{
			Destination: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: ip4(10, 0, 0, 9)}}},
			Weight:      3,
		}},
		Visibility:         workloadapi.Service_NAMESPACE,
		IngressUseWaypoint: true,
	}
	want := &state.Service{
		Name: "svc", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local",
		VIPs: []state.NetworkAddress{
			{Address: netip.MustParseAddr("10.96.0.1")},
			{Network: "n", Address: netip.MustParseAddr("10.96.0.2")},
		},
		CIDRVIPs: []state.NetworkPrefix{
			{Network: "n", Prefix: netip.MustParsePrefix("10.97.0.0/16")},
			{Prefix: netip.MustParsePrefix("fd00::/64")},
		},
		Ports:           state.PortMap{80: 9090},
		SubjectAltNames: []string{"spiffe://td/ns/ns/sa/x"},
		Waypoint:        &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp"}, HBONEMTLSPort: 15008},
		WeightedWaypoints: []state.WeightedWaypoint{{
			Destination: state.GatewayAddress{Address: &state.NetworkAddress{Address: netip.MustParseAddr("10.0.0.9")}},
			Weight:      3,
		}},
		LoadBalancer: &state.LoadBalancer{
			RoutingPreference: []state.LBScope{state.ScopeNetwork, state.ScopeRegion},
			Mode:              state.LBFailover,
			HealthPolicy:      state.AllowAll,
		},
		IPFamilies: state.FamiliesDual,
		Canonical:  true,
		Visibility: state.VisibilityNamespace,
	}
	got, err := ServiceFromProto(in)
	if err != nil {
		t.Fatalf("ServiceFromProto: %v", err)
	}
	if diff := cmp.Diff(want, got, cmpNetip); diff != "" {
		t.Errorf("ServiceFromProto mismatch (-want +got):\n%s", diff)
	}

	// An unknown visibility is PUBLIC (SPEC §5.4).
	got, err = ServiceFromProto(&workloadapi.Service{Namespace: "ns", Hostname: "h", Visibility: 7})
	if err != nil || got.Visibility != state.VisibilityPublic {
		t.Errorf("ServiceFromProto(visibility 7) = %+v, %v; want Public", got, err)
	}
}

func TestServiceFromProtoRejects(t *testing.T) {
	ok := func(mod func(s *workloadapi.Service)) *workloadapi.Service {
		s := &workloadapi.Service{Name: "s", Namespace: "ns", Hostname: "h"}
		mod(s)
		return s
	}
	tests := []struct {
		name string
		in   *workloadapi.Service
		want string
	}{
		{"nil", nil, "nil"},
		{"no namespace", ok(func(s *workloadapi.Service) { s.Namespace = "" }), "namespace and hostname are required"},
		{"no hostname", ok(func(s *workloadapi.Service) { s.Hostname = "" }), "namespace and hostname are required"},
		{"slash in namespace", ok(func(s *workloadapi.Service) { s.Namespace = "a/b" }), "namespace and hostname are required"},
		{"bad vip", ok(func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: []byte{1, 2, 3}}}
		}), "addresses[0]: address of 3 bytes"},
		{"cidr too long", ok(func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: ip4(1, 2, 3, 4), Length: u32(33)}}
		}), "prefix length 33"},
		{"port", ok(func(s *workloadapi.Service) { s.Ports = []*workloadapi.Port{{ServicePort: 65536}} }), "port 65536 out of range"},
		{"unspecified scope", ok(func(s *workloadapi.Service) {
			s.LoadBalancing = &workloadapi.LoadBalancing{RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_UNSPECIFIED_SCOPE}}
		}), "invalid scope 0"},
		{"unknown scope", ok(func(s *workloadapi.Service) {
			s.LoadBalancing = &workloadapi.LoadBalancing{RoutingPreference: []workloadapi.LoadBalancing_Scope{7}}
		}), "invalid scope 7"},
		{"unknown mode", ok(func(s *workloadapi.Service) { s.LoadBalancing = &workloadapi.LoadBalancing{Mode: 4} }), "unknown mode"},
		{"unknown health", ok(func(s *workloadapi.Service) { s.LoadBalancing = &workloadapi.LoadBalancing{HealthPolicy: 2} }), "unknown health_policy"},
		{"unknown ip families", ok(func(s *workloadapi.Service) { s.IpFamilies = 4 }), "unknown ip_families"},
		{"weighted waypoint without destination", ok(func(s *workloadapi.Service) {
			s.WeightedWaypoints = []*workloadapi.WeightedWaypoint{{Weight: 1}}
		}), "weighted_waypoints[0]: no destination"},
		{"waypoint without destination", ok(func(s *workloadapi.Service) { s.Waypoint = &workloadapi.GatewayAddress{} }), "waypoint: no destination"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ServiceFromProto(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ServiceFromProto = %+v, %v; want error containing %q", got, err, tt.want)
			}
		})
	}
}

func exact(s string) *security.StringMatch {
	return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: s}}
}

func TestPolicyFromProto(t *testing.T) {
	in := &security.Authorization{
		Name: "p", Namespace: "ns", Scope: security.Scope_WORKLOAD_SELECTOR, Action: security.Action_DENY, DryRun: true,
		Groups: []*security.Group{
			{Rules: []*security.Rules{
				{Matches: []*security.Match{{
					Namespaces:    []*security.StringMatch{exact("a"), {MatchType: &security.StringMatch_Prefix{Prefix: "b"}}},
					NotNamespaces: []*security.StringMatch{{MatchType: &security.StringMatch_Suffix{Suffix: "c"}}},
					Principals:    []*security.StringMatch{{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
					NotPrincipals: []*security.StringMatch{exact("td/ns/x/sa/y")},
					SourceIps:     []*security.Address{{Address: ip4(10, 0, 0, 0), Length: 8}},
					NotSourceIps:  []*security.Address{{Address: netip.MustParseAddr("::ffff:192.168.0.0").AsSlice(), Length: 112}},
					DestinationIps: []*security.Address{
						{Address: netip.MustParseAddr("fd00::").AsSlice(), Length: 16},
					},
					NotDestinationIps:   []*security.Address{{Address: ip4(1, 2, 3, 4), Length: 32}},
					DestinationPorts:    []uint32{80, 443},
					NotDestinationPorts: []uint32{9999},
					ServiceAccounts:     []*security.ServiceAccountMatch{{Namespace: "ns", ServiceAccount: "sa"}},
					NotServiceAccounts:  []*security.ServiceAccountMatch{{Namespace: "ns2", ServiceAccount: "sa2"}},
				}}},
				{}, // a clause with no matches
			}},
			{}, // a rule with no clauses
		},
	}
	want := &rbac.Policy{
		Name: "p", Namespace: "ns", Scope: rbac.WorkloadSelector, Action: rbac.Deny, DryRun: true,
		Rules: []rbac.Rule{
			{Clauses: []rbac.Clause{
				{Matches: []rbac.Match{{
					Namespaces:          []rbac.StringMatch{{Kind: rbac.Exact, Value: "a"}, {Kind: rbac.Prefix, Value: "b"}},
					NotNamespaces:       []rbac.StringMatch{{Kind: rbac.Suffix, Value: "c"}},
					Principals:          []rbac.StringMatch{{Kind: rbac.Presence}},
					NotPrincipals:       []rbac.StringMatch{{Kind: rbac.Exact, Value: "td/ns/x/sa/y"}},
					SourceIPs:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
					NotSourceIPs:        []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
					DestinationIPs:      []netip.Prefix{netip.MustParsePrefix("fd00::/16")},
					NotDestinationIPs:   []netip.Prefix{netip.MustParsePrefix("1.2.3.4/32")},
					DestinationPorts:    []uint16{80, 443},
					NotDestinationPorts: []uint16{9999},
					ServiceAccounts:     []rbac.ServiceAccountMatch{{Namespace: "ns", ServiceAccount: "sa"}},
					NotServiceAccounts:  []rbac.ServiceAccountMatch{{Namespace: "ns2", ServiceAccount: "sa2"}},
				}}},
				{},
			}},
			{},
		},
	}
	got, err := PolicyFromProto(in)
	if err != nil {
		t.Fatalf("PolicyFromProto: %v", err)
	}
	if diff := cmp.Diff(want, got, cmpNetip); diff != "" {
		t.Errorf("PolicyFromProto mismatch (-want +got):\n%s", diff)
	}
}

// TestPolicyFromProtoRejects covers TESTPLAN bad input 40: what cannot be
// evaluated faithfully is refused, never guessed at.
func TestPolicyFromProtoRejects(t *testing.T) {
	withMatch := func(m *security.Match) *security.Authorization {
		return &security.Authorization{Name: "p", Namespace: "ns", Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{m}}}}}}
	}
	tests := []struct {
		name string
		in   *security.Authorization
		want string
	}{
		{"nil", nil, "nil"},
		{"unknown action", &security.Authorization{Name: "p", Namespace: "ns", Action: 2}, "unknown action 2"},
		{"unknown scope", &security.Authorization{Name: "p", Namespace: "ns", Scope: 3}, "unknown scope 3"},
		{"no name", &security.Authorization{Namespace: "ns"}, "empty name"},
		{"no namespace", &security.Authorization{Name: "p"}, "empty namespace"},
		{"string match without kind", withMatch(&security.Match{Principals: []*security.StringMatch{exact("x"), {}}}),
			"groups[0].rules[0].matches[0].principals[1]: string match without"},
		{"port 70000", withMatch(&security.Match{NotDestinationPorts: []uint32{70000}}), "not_destination_ports[0]: port 70000"},
		{"5-byte cidr", withMatch(&security.Match{SourceIps: []*security.Address{{Address: []byte{1, 2, 3, 4, 5}, Length: 8}}}),
			"source_ips[0]: address of 5 bytes"},
		{"cidr length", withMatch(&security.Match{DestinationIps: []*security.Address{{Address: ip4(1, 2, 3, 4), Length: 33}}}),
			"destination_ips[0]: prefix length 33"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PolicyFromProto(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("PolicyFromProto = %+v, %v; want error containing %q", got, err, tt.want)
			}
		})
	}
}

// TestPolicyEmptyRulesAccepted: a policy with no rules (or an L7-only rule
// that istiod turned into an empty match) is well defined and applied; its
// meaning (ALLOW denies everything, DENY is inert or denies) is rbac's.
func TestPolicyEmptyRulesAccepted(t *testing.T) {
	for _, in := range []*security.Authorization{
		{Name: "p", Namespace: "ns", Action: security.Action_ALLOW},
		{Name: "p", Namespace: "ns", Action: security.Action_DENY, Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{}}}}}}},
	} {
		if _, err := PolicyFromProto(in); err != nil {
			t.Errorf("PolicyFromProto(%v) = %v, want nil", in, err)
		}
	}
}

func TestAddressFromProto(t *testing.T) {
	w, s, err := AddressFromProto(WorkloadAddress(&workloadapi.Workload{Uid: "u"}))
	if err != nil || w == nil || s != nil || w.UID != "u" {
		t.Errorf("AddressFromProto(workload) = %v, %v, %v", w, s, err)
	}
	w, s, err = AddressFromProto(ServiceAddress(&workloadapi.Service{Namespace: "ns", Hostname: "h"}))
	if err != nil || w != nil || s == nil || s.Key() != "ns/h" {
		t.Errorf("AddressFromProto(service) = %v, %v, %v", w, s, err)
	}
	for _, a := range []*workloadapi.Address{nil, {}} {
		if w, s, err := AddressFromProto(a); err == nil {
			t.Errorf("AddressFromProto(%v) = %v, %v, nil; want error", a, w, s)
		}
	}
	if _, _, err := AddressFromProto(WorkloadAddress(&workloadapi.Workload{})); err == nil {
		t.Error("AddressFromProto(workload without uid) succeeded")
	}
}

// TestConvertedValuesAreAccepted checks that every value the conversion
// accepts is also accepted by the store, so no rejection waits until the
// batch is applied.
func TestConvertedValuesAreAccepted(t *testing.T) {
	r := newGen(1)
	st := state.NewStore(state.Config{})
	for range 500 {
		w, s, p := r.workload(), r.service(), r.policy()
		var errs []error
		st.Update(func(b *state.Batch) {
			errs = append(errs, b.InsertWorkload(w), b.InsertService(s), b.InsertPolicy(p))
		})
		for _, err := range errs {
			if err != nil {
				t.Fatalf("store refused a converted value: %v", err)
			}
		}
	}
}

// TestRoundTrip is a property test: for generated values v (as the
// conversion produces them), FromProto(ToProto(v)) == v, also through the
// wire encoding.
func TestRoundTrip(t *testing.T) {
	r := newGen(2)
	for i := range 1000 {
		w := r.workload()
		b, err := proto.Marshal(WorkloadAddress(WorkloadToProto(w)))
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var a workloadapi.Address
		if err := proto.Unmarshal(b, &a); err != nil {
			t.Fatalf("unmarshal: %v", err)
		}
		gw, _, err := AddressFromProto(&a)
		if err != nil {
			t.Fatalf("case %d: AddressFromProto(WorkloadToProto(%+v)): %v", i, w, err)
		}
		if diff := cmp.Diff(w, gw, cmpNetip); diff != "" {
			t.Fatalf("case %d: workload round trip (-want +got):\n%s", i, diff)
		}

		s := r.service()
		gs, err := ServiceFromProto(ServiceToProto(s))
		if err != nil {
			t.Fatalf("case %d: ServiceFromProto(ServiceToProto(%+v)): %v", i, s, err)
		}
		if diff := cmp.Diff(s, gs, cmpNetip); diff != "" {
			t.Fatalf("case %d: service round trip (-want +got):\n%s", i, diff)
		}

		p := r.policy()
		gp, err := PolicyFromProto(PolicyToProto(p))
		if err != nil {
			t.Fatalf("case %d: PolicyFromProto(PolicyToProto(%+v)): %v", i, p, err)
		}
		if diff := cmp.Diff(p, gp, cmpNetip); diff != "" {
			t.Fatalf("case %d: policy round trip (-want +got):\n%s", i, diff)
		}
	}
}
