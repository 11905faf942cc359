package configdump

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata golden files")

// cmpOpts compares netip values by ==.
var cmpOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func vip(network, s string) state.NetworkAddress {
	return state.NetworkAddress{Network: network, Address: ip(s)}
}

func cidr(network, s string) state.NetworkPrefix {
	return state.NetworkPrefix{Network: network, Prefix: netip.MustParsePrefix(s)}
}

// richStore holds one of everything the dump can show.
func richStore(t testing.TB) *state.Store {
	t.Helper()
	full := &state.Workload{
		UID: "c1//Pod/ns1/full", Name: "full", Namespace: "ns1",
		Addresses: []netip.Addr{ip("10.0.0.1"), ip("fd00::1")},
		Hostname:  "full.example", Network: "net1", Protocol: state.TunnelHBONE,
		TrustDomain: "td.example", ServiceAccount: "sa1",
		Waypoint:       &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns1", Hostname: "waypoint.ns1.svc.cluster.local"}, HBONEMTLSPort: 15008},
		NetworkGateway: &state.GatewayAddress{Address: &state.NetworkAddress{Network: "net1", Address: ip("192.168.0.1")}, HBONEMTLSPort: 15009},
		Node:           "node1", CanonicalName: "full-app", CanonicalRevision: "v1",
		WorkloadType: state.WorkloadPod, WorkloadName: "full-wl", NativeTunnel: true,
		ApplicationTunnel: &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088},
		Services: map[string]state.PortMap{
			"ns1/svc.example":    {80: 8080, 443: 0},
			"ns1/staged.example": {90: 9090},
		},
		AuthorizationPolicies: []string{"ns1/sel"},
		Status:                state.StatusHealthy, ClusterID: "cluster1",
		Locality:    state.Locality{Region: "region1", Zone: "zone1", Subzone: "sub1"},
		NetworkMode: state.NetworkStandard, Capacity: 3,
	}
	minimal := &state.Workload{UID: "c1//Pod/ns1/minimal", Name: "minimal", Namespace: "ns1",
		Addresses: []netip.Addr{ip("10.0.0.2")}, Status: state.StatusUnhealthy, NetworkMode: state.NetworkHost,
		WorkloadType: state.WorkloadCronJob,
		Services:     map[string]state.PortMap{"ns1/svc.example": {80: 8080}, "ns1/other.example": {}}}
	service := &state.Service{
		Name: "svc", Namespace: "ns1", Hostname: "svc.example",
		VIPs:            []state.NetworkAddress{vip("", "10.96.0.1"), vip("net1", "fd00::96")},
		CIDRVIPs:        []state.NetworkPrefix{cidr("", "10.200.0.0/16")},
		Ports:           state.PortMap{80: 8080, 443: 0},
		SubjectAltNames: []string{"spiffe://td.example/ns/ns1/sa/extra"},
		Waypoint:        &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.0.0.9")}, HBONEMTLSPort: 15008},
		WeightedWaypoints: []state.WeightedWaypoint{
			{Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns1", Hostname: "wp-a"}, HBONEMTLSPort: 15008}, Weight: 80},
			{Destination: state.GatewayAddress{Address: &state.NetworkAddress{Network: "net1", Address: ip("10.0.0.10")}, HBONEMTLSPort: 15008}, Weight: 20},
		},
		LoadBalancer: &state.LoadBalancer{RoutingPreference: []state.LBScope{state.ScopeNetwork, state.ScopeRegion, state.ScopeZone}, Mode: state.LBFailover, HealthPolicy: state.AllowAll},
		IPFamilies:   state.FamiliesDual, Canonical: true, Visibility: state.VisibilityNamespace,
	}
	other := &state.Service{Name: "other", Namespace: "ns1", Hostname: "other.example"}
	pol := &rbac.Policy{
		Name: "deny", Namespace: "ns1", Scope: rbac.Global, Action: rbac.Deny, DryRun: true,
		Rules: []rbac.Rule{
			{Clauses: []rbac.Clause{
				{Matches: []rbac.Match{{
					Namespaces:          []rbac.StringMatch{{Kind: rbac.Exact, Value: "ns2"}, {Kind: rbac.Prefix, Value: "team-"}},
					NotNamespaces:       []rbac.StringMatch{{Kind: rbac.Suffix, Value: "-prod"}},
					Principals:          []rbac.StringMatch{{Kind: rbac.Presence}},
					NotPrincipals:       []rbac.StringMatch{{Kind: rbac.Exact, Value: "td/ns/a/sa/b"}},
					ServiceAccounts:     []rbac.ServiceAccountMatch{{Namespace: "ns2", ServiceAccount: "sa2"}},
					NotServiceAccounts:  []rbac.ServiceAccountMatch{{Namespace: "ns3", ServiceAccount: "sa3"}},
					SourceIPs:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
					NotSourceIPs:        []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
					DestinationIPs:      []netip.Prefix{netip.MustParsePrefix("fd00::/64")},
					NotDestinationIPs:   []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")},
					DestinationPorts:    []uint16{80, 443},
					NotDestinationPorts: []uint16{9999},
				}, {DestinationPorts: []uint16{8080}}}},
				{},
			}},
			{},
		},
	}
	sel := &rbac.Policy{Name: "sel", Namespace: "ns1", Scope: rbac.WorkloadSelector}
	return newStore(t, func(b *state.Batch) error {
		return errors.Join(
			b.InsertWorkload(full),
			b.InsertWorkload(minimal),
			b.InsertService(service),
			b.InsertService(other),
			b.InsertPolicy(pol),
			b.InsertPolicy(sel),
		)
	})
}

// newStore returns a store that apply filled in one batch, failing t if
// apply returns an error.
func newStore(t testing.TB, apply func(*state.Batch) error) *state.Store {
	t.Helper()
	st := state.NewStore(state.Config{})
	var err error
	st.Update(func(b *state.Batch) { err = apply(b) })
	if err != nil {
		t.Fatalf("store rejected the batch: %v", err)
	}
	return st
}

func TestDumpGolden(t *testing.T) {
	got, err := json.MarshalIndent(FromSnapshot(richStore(t).Snapshot()), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "dump.golden.json")
	if *updateGolden {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Dump JSON (-golden +got):\n%s", diff)
	}
}

func TestEmptyDump(t *testing.T) {
	got, err := json.Marshal(FromSnapshot(state.NewStore(state.Config{}).Snapshot()))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"workloads":[],"services":[],"policies":[],"stagedServices":{}}`
	if string(got) != want {
		t.Errorf("empty Dump = %s, want %s", got, want)
	}
}

// TestDumpRoundTrip parses the dump, applies it to a new store and checks
// that the new store dumps the same JSON.
func TestDumpRoundTrip(t *testing.T) {
	orig := richStore(t).Snapshot()
	data, err := json.Marshal(FromSnapshot(orig))
	if err != nil {
		t.Fatal(err)
	}
	// Parse accepts a whole config_dump with other keys.
	whole := append([]byte(`{"version":{"version":"x"},"certificates":[],`), data[1:]...)
	d, err := Parse(whole)
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t, d.Apply)
	again, err := json.Marshal(FromSnapshot(st.Snapshot()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, again) {
		t.Errorf("round trip changed the dump:\n%s", cmp.Diff(string(data), string(again)))
	}
	// Values other than those lost by design (see Dump.State) come back equal.
	for _, w := range orig.Workloads() {
		got := st.Snapshot().WorkloadByUID(w.UID)
		want := *w
		if w.Status == state.StatusUnhealthy {
			// Its endpoint in an OnlyHealthy service is not in the dump:
			// the membership survives, the ports do not.
			want.Services = map[string]state.PortMap{"ns1/svc.example": {80: 8080}, "ns1/other.example": {}}
		}
		if diff := cmp.Diff(&want, got, cmpOpts); diff != "" {
			t.Errorf("workload %s (-orig +round-tripped):\n%s", w.UID, diff)
		}
	}
	for _, p := range orig.Policies() {
		if diff := cmp.Diff(p, st.Snapshot().Policy(p.Key()), cmpOpts); diff != "" {
			t.Errorf("policy %s (-orig +round-tripped):\n%s", p.Key(), diff)
		}
	}
	for _, s := range orig.Services() {
		if diff := cmp.Diff(s, st.Snapshot().ServiceByKey(s.Key()), cmpOpts); diff != "" {
			t.Errorf("service %s (-orig +round-tripped):\n%s", s.Key(), diff)
		}
	}
}

func TestParseDumpErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"syntax", `{`, "state: parse config dump"},
		{"protocol", `{"workloads":[{"uid":"u","protocol":"QUIC"}]}`, `workload u: protocol: unknown value "QUIC"`},
		{"ip", `{"workloads":[{"uid":"u","workloadIps":["nope"]}]}`, "workload u: workloadIps"},
		{"waypoint", `{"workloads":[{"uid":"u","waypoint":{"destination":"x"}}]}`, "workload u: waypoint"},
		{"vip", `{"services":[{"namespace":"n","hostname":"h","vips":["1.2.3.4"]}]}`, "service n/h: vips"},
		{"ipFamilies", `{"services":[{"namespace":"n","hostname":"h","ipFamilies":"Automatic"}]}`, "service n/h: ipFamilies"},
		{"routing", `{"services":[{"namespace":"n","hostname":"h","loadBalancer":{"routingPreferences":["Planet"]}}]}`, "service n/h: loadBalancer"},
		{"scope", `{"policies":[{"name":"p","namespace":"n","scope":"Cluster"}]}`, "policy n/p: scope"},
		{"string match", `{"policies":[{"name":"p","namespace":"n","rules":[[[{"namespaces":[{"Regex":"x"}]}]]]}]}`, `unknown string match "Regex"`},
		{"two-key match", `{"policies":[{"name":"p","namespace":"n","rules":[[[{"namespaces":[{"Exact":"x","Prefix":"y"}]}]]]}]}`, "exactly one"},
		{"cidr", `{"policies":[{"name":"p","namespace":"n","rules":[[[{"sourceIps":["10.0.0.0/33"]}]]]}]}`, "policy n/p: rules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse([]byte(tt.json))
			if err == nil {
				_, _, _, err = d.State()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestStringMatchJSON(t *testing.T) {
	for _, m := range []rbac.StringMatch{
		{Kind: rbac.Exact, Value: `a"b`}, {Kind: rbac.Prefix, Value: "p"}, {Kind: rbac.Suffix}, {Kind: rbac.Presence},
	} {
		data, err := json.Marshal(StringMatchJSON(m))
		if err != nil {
			t.Fatal(err)
		}
		var back StringMatchJSON
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", data, err)
		}
		if rbac.StringMatch(back) != m {
			t.Errorf("round trip of %+v via %s = %+v", m, data, back)
		}
	}
	if data, _ := json.Marshal(StringMatchJSON{Kind: rbac.Presence}); string(data) != `{"Presence":[]}` {
		t.Errorf("Presence = %s, want {\"Presence\":[]}", data)
	}
	if _, err := json.Marshal(StringMatchJSON{Kind: 9}); err == nil {
		t.Error("Marshal of unknown kind succeeded")
	}
}
