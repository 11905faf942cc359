package xds

import (
	"encoding/json"
	"errors"
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

var cmpOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

func mustParse(t testing.TB, doc string) *LocalConfig {
	t.Helper()
	cfg, err := ParseLocalConfig("test.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("ParseLocalConfig: %v", err)
	}
	return cfg
}

func TestParseLocalConfigGood(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want *LocalConfig // Raw is not compared
	}{
		{"empty", "", &LocalConfig{}},
		{"comment only", "# nothing\n", &LocalConfig{}},
		{"null lists", "workloads:\nservices: ~\npolicies: []\n", &LocalConfig{}},
		{
			"workload defaults not applied",
			"workloads:\n- name: a\n  namespace: ns\n  workloadIps: []\n",
			&LocalConfig{Workloads: []*state.Workload{{UID: "ns/a", Name: "a", Namespace: "ns", Addresses: []netip.Addr{}}}},
		},
		{
			"workload every field",
			`workloads:
- uid: c//Pod/ns/a
  name: a
  namespace: ns
  workloadIps: ["10.0.0.1", "::ffff:10.0.0.2", "fd00::1"]
  hostname: a.example
  network: net1
  protocol: HBONE
  trustDomain: td
  serviceAccount: sa
  waypoint: {destination: ns/wp.example, hboneMtlsPort: 15008}
  networkGateway: {destination: net1/192.168.0.1, hboneMtlsPort: 15009}
  node: n1
  canonicalName: app
  canonicalRevision: v1
  workloadType: pod
  workloadName: wl
  nativeTunnel: true
  applicationTunnel: {protocol: PROXY, port: 15088}
  services:
    ns/s.example: {80: 8080, "443": 0}
    ns/empty.example: {}
  authorizationPolicies: [ns/p]
  status: Unhealthy
  clusterId: c1
  locality: {region: r, zone: z, subzone: s}
  networkMode: HostNetwork
  capacity: 4
`,
			&LocalConfig{Workloads: []*state.Workload{{
				UID: "c//Pod/ns/a", Name: "a", Namespace: "ns",
				Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1")},
				Hostname:  "a.example", Network: "net1", Protocol: state.TunnelHBONE, TrustDomain: "td", ServiceAccount: "sa",
				Waypoint:       &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp.example"}, HBONEMTLSPort: 15008},
				NetworkGateway: &state.GatewayAddress{Address: &state.NetworkAddress{Network: "net1", Address: netip.MustParseAddr("192.168.0.1")}, HBONEMTLSPort: 15009},
				Node:           "n1", CanonicalName: "app", CanonicalRevision: "v1", WorkloadType: state.WorkloadPod, WorkloadName: "wl",
				NativeTunnel: true, ApplicationTunnel: &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088},
				Services:              map[string]state.PortMap{"ns/s.example": {80: 8080, 443: 0}, "ns/empty.example": {}},
				AuthorizationPolicies: []string{"ns/p"}, Status: state.StatusUnhealthy, ClusterID: "c1",
				Locality:    state.Locality{Region: "r", Zone: "z", Subzone: "s"},
				NetworkMode: state.NetworkHost, Capacity: 4,
			}}},
		},
		{
			"service every field",
			`services:
- name: s
  namespace: ns
  hostname: s.example
  vips: [/10.96.0.1, net1/fd00::96]
  cidrVips: [/10.200.0.0/16]
  ports: {80: 8080}
  subjectAltNames: [spiffe://td/ns/ns/sa/x]
  waypoint: {destination: /10.0.0.9}
  weightedWaypoints:
  - {destination: ns/wp-a, hboneMtlsPort: 15008, weight: 80}
  loadBalancer: {routingPreferences: [Network, Zone], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: IPv6
  canonical: true
  visibility: Namespace
`,
			&LocalConfig{Services: []*state.Service{{
				Name: "s", Namespace: "ns", Hostname: "s.example",
				VIPs:            []state.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.1")}, {Network: "net1", Address: netip.MustParseAddr("fd00::96")}},
				CIDRVIPs:        []state.NetworkPrefix{{Prefix: netip.MustParsePrefix("10.200.0.0/16")}},
				Ports:           state.PortMap{80: 8080},
				SubjectAltNames: []string{"spiffe://td/ns/ns/sa/x"},
				Waypoint:        &state.GatewayAddress{Address: &state.NetworkAddress{Address: netip.MustParseAddr("10.0.0.9")}},
				WeightedWaypoints: []state.WeightedWaypoint{{
					Destination: state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp-a"}, HBONEMTLSPort: 15008}, Weight: 80,
				}},
				LoadBalancer: &state.LoadBalancer{RoutingPreference: []state.LBScope{state.ScopeNetwork, state.ScopeZone}, Mode: state.LBFailover, HealthPolicy: state.AllowAll},
				IPFamilies:   state.FamiliesIPv6Only, Canonical: true, Visibility: state.VisibilityNamespace,
			}}},
		},
		{
			"policy every match",
			`policies:
- name: p
  namespace: ns
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - namespaces: [{Exact: a}, {Prefix: b}]
        notNamespaces: [{Suffix: c}]
        principals: [{Presence: []}]
        notPrincipals: [{Presence: }]
        serviceAccounts: [{namespace: ns, serviceAccount: sa}]
        notServiceAccounts: [{namespace: ns2, serviceAccount: sa2}]
        sourceIps: [10.0.0.0/8, 10.1.1.1]
        notSourceIps: ["::ffff:10.2.0.0/112"]
        destinationIps: [fd00::/64]
        notDestinationIps: [10.0.0.1/32]
        destinationPorts: [80]
        notDestinationPorts: [9999]
    - []
  - []
`,
			&LocalConfig{Policies: []*rbac.Policy{{
				Name: "p", Namespace: "ns", Scope: rbac.WorkloadSelector, Action: rbac.Deny, DryRun: true,
				Rules: []rbac.Rule{{Clauses: []rbac.Clause{{Matches: []rbac.Match{{
					Namespaces:          []rbac.StringMatch{{Kind: rbac.Exact, Value: "a"}, {Kind: rbac.Prefix, Value: "b"}},
					NotNamespaces:       []rbac.StringMatch{{Kind: rbac.Suffix, Value: "c"}},
					Principals:          []rbac.StringMatch{{Kind: rbac.Presence}},
					NotPrincipals:       []rbac.StringMatch{{Kind: rbac.Presence}},
					ServiceAccounts:     []rbac.ServiceAccountMatch{{Namespace: "ns", ServiceAccount: "sa"}},
					NotServiceAccounts:  []rbac.ServiceAccountMatch{{Namespace: "ns2", ServiceAccount: "sa2"}},
					SourceIPs:           []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.1.1/32")},
					NotSourceIPs:        []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")},
					DestinationIPs:      []netip.Prefix{netip.MustParsePrefix("fd00::/64")},
					NotDestinationIPs:   []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")},
					DestinationPorts:    []uint16{80},
					NotDestinationPorts: []uint16{9999},
				}}}, {}}}, {}},
			}}},
		},
		{
			"anchors and aliases",
			`x-ips: &ips ["10.0.0.1"]
`[:0] + `workloads:
- &w {name: a, namespace: ns, workloadIps: ["10.0.0.1"]}
- {uid: other, name: a, namespace: ns, workloadIps: ["10.0.0.2"]}
`,
			&LocalConfig{Workloads: []*state.Workload{
				{UID: "ns/a", Name: "a", Namespace: "ns", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
				{UID: "other", Name: "a", Namespace: "ns", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustParse(t, tt.doc)
			if diff := cmp.Diff(tt.want, got, cmpOpts, cmpopts.IgnoreFields(LocalConfig{}, "Raw")); diff != "" {
				t.Errorf("ParseLocalConfig (-want +got):\n%s", diff)
			}
			if _, err := json.Marshal(got.Raw); err != nil {
				t.Errorf("Raw is not JSON-encodable: %v", err)
			}
		})
	}
}

func TestParseLocalConfigBad(t *testing.T) {
	const wl = "workloads:\n- name: a\n  namespace: ns\n  workloadIps: [10.0.0.1]\n"
	tests := []struct {
		name, doc, want string
	}{
		{"syntax", "workloads: [\n", "test.yaml:1:1: (root): did not find expected node content"},
		{"top level list", "- name: a\n", "test.yaml:1:1: (root): expected a mapping, got a list"},
		{"top level scalar", "hello\n", `test.yaml:1:1: (root): expected a mapping, got "hello"`},
		{"unknown top-level key", "workload: []\n", "test.yaml:1:1: workload: unknown key"},
		{"two documents", "workloads: []\n---\nservices: []\n", "test.yaml:2:1: (root): more than one YAML document"},
		{"workloads not a list", "workloads: {}\n", "test.yaml:1:12: workloads: expected a list, got a mapping"},
		{"unknown workload key", wl + "  colour: red\n", "test.yaml:5:3: workloads[0].colour: unknown key"},
		{"missing namespace", "workloads:\n- name: a\n  workloadIps: []\n", "test.yaml:2:3: workloads[0].namespace: missing required key"},
		{"empty namespace", "workloads:\n- name: a\n  namespace: ''\n  workloadIps: []\n", "test.yaml:3:14: workloads[0].namespace: must not be empty"},
		{"missing workloadIps", "workloads:\n- name: a\n  namespace: ns\n", "test.yaml:2:3: workloads[0].workloadIps: missing required key"},
		{"no uid or name", "workloads:\n- namespace: ns\n  workloadIps: []\n", "test.yaml:2:3: workloads[0].uid: uid or name is required"},
		{"bad ip", "workloads:\n- name: a\n  namespace: ns\n  workloadIps: [10.0.0.1, 10.0.0.300]\n", `test.yaml:4:27: workloads[0].workloadIps[1]: invalid IP address "10.0.0.300"`},
		{"ip not a string", "workloads:\n- name: a\n  namespace: ns\n  workloadIps: [[1]]\n", "test.yaml:4:17: workloads[0].workloadIps[0]: expected a string, got a list"},
		{"bad protocol", wl + "  protocol: hbone\n", `test.yaml:5:13: workloads[0].protocol: unknown value "hbone" (want one of TCP, HBONE)`},
		{"bad workload type", wl + "  workloadType: Pod\n", `test.yaml:5:17: workloads[0].workloadType: unknown value "Pod" (want one of deployment, cronjob, pod, job)`},
		{"bad status", wl + "  status: Ready\n", `test.yaml:5:11: workloads[0].status: unknown value "Ready" (want one of Healthy, Unhealthy)`},
		{"bad network mode", wl + "  networkMode: Host\n", `test.yaml:5:16: workloads[0].networkMode: unknown value "Host" (want one of Standard, HostNetwork)`},
		{"bool as string", wl + "  nativeTunnel: \"yes\"\n", `test.yaml:5:17: workloads[0].nativeTunnel: expected true or false, got "yes"`},
		{"name not a string", wl + "  hostname: 12\n", "test.yaml:5:13: workloads[0].hostname: expected a string, got 12"},
		{"capacity negative", wl + "  capacity: -1\n", "test.yaml:5:13: workloads[0].capacity: -1 out of range (0-4294967295)"},
		{"service port too big", wl + "  services:\n    ns/s: {70000: 80}\n", `test.yaml:6:12: workloads[0].services["ns/s"]["70000"]: 70000 out of range (0-65535)`},
		{"target port too big", wl + "  services:\n    ns/s: {80: 65536}\n", `test.yaml:6:16: workloads[0].services["ns/s"]["80"]: 65536 out of range (0-65535)`},
		{"port not a number", wl + "  services:\n    ns/s: {http: 80}\n", `test.yaml:6:12: workloads[0].services["ns/s"].http: service port "http" is not a number`},
		{"port float", wl + "  services:\n    ns/s: {80: 80.5}\n", `test.yaml:6:16: workloads[0].services["ns/s"]["80"]: expected an integer, got 80.5`},
		{"bad service key", wl + "  services:\n    s: {80: 80}\n", `test.yaml:6:5: workloads[0].services.s: "s" is not namespace/hostname`},
		{"duplicate key", wl + "  name: b\n", "test.yaml:5:3: workloads[0].name: duplicate key"},
		{"duplicate uid", "workloads:\n- {name: a, namespace: ns, workloadIps: []}\n- {name: a, namespace: ns, workloadIps: []}\n", `test.yaml:3:3: workloads[1]: duplicate workload uid "ns/a"`},
		{"bad policy ref", wl + "  authorizationPolicies: [p]\n", `test.yaml:5:27: workloads[0].authorizationPolicies[0]: "p" is not namespace/name`},
		{"waypoint unknown key", wl + "  waypoint: {destination: ns/w, port: 1}\n", "test.yaml:5:33: workloads[0].waypoint.port: unknown key"},
		{"waypoint no destination", wl + "  waypoint: {hboneMtlsPort: 1}\n", "test.yaml:5:13: workloads[0].waypoint.destination: missing required key"},
		{"waypoint bad destination", wl + "  waypoint: {destination: nowhere}\n", `test.yaml:5:27: workloads[0].waypoint.destination: destination "nowhere" is not network/IP or namespace/hostname`},
		{"app tunnel protocol", wl + "  applicationTunnel: {protocol: HTTP}\n", `test.yaml:5:33: workloads[0].applicationTunnel.protocol: unknown value "HTTP" (want one of NONE, PROXY)`},
		{"locality unknown key", wl + "  locality: {country: x}\n", "test.yaml:5:14: workloads[0].locality.country: unknown key"},
		{"merge key", "workloads:\n- <<: {name: a}\n  namespace: ns\n  workloadIps: []\n", `test.yaml:2:3: workloads[0]: unsupported mapping key "<<"`},

		{"service unknown key", "services:\n- {namespace: ns, hostname: h, endpoints: {}}\n", "test.yaml:2:32: services[0].endpoints: unknown key"},
		{"service missing hostname", "services:\n- {namespace: ns}\n", "test.yaml:2:3: services[0].hostname: missing required key"},
		{"service bad vip", "services:\n- {namespace: ns, hostname: h, vips: [10.0.0.1]}\n", `test.yaml:2:39: services[0].vips[0]: "10.0.0.1" is not network/IP`},
		{"service bad vip ip", "services:\n- {namespace: ns, hostname: h, vips: [/10.0.0.999]}\n", `test.yaml:2:39: services[0].vips[0]: "/10.0.0.999": invalid IP "10.0.0.999"`},
		{"service bad cidr", "services:\n- {namespace: ns, hostname: h, cidrVips: [/10.0.0.0/40]}\n", `test.yaml:2:43: services[0].cidrVips[0]: "/10.0.0.0/40": invalid CIDR "10.0.0.0/40"`},
		{"service port", "services:\n- {namespace: ns, hostname: h, ports: {80: 99999}}\n", `test.yaml:2:44: services[0].ports["80"]: 99999 out of range (0-65535)`},
		{"service ip families", "services:\n- {namespace: ns, hostname: h, ipFamilies: Automatic}\n", `test.yaml:2:44: services[0].ipFamilies: unknown value "Automatic" (want one of IPv4, IPv6, Dual)`},
		{"service visibility", "services:\n- {namespace: ns, hostname: h, visibility: Private}\n", `test.yaml:2:44: services[0].visibility: unknown value "Private" (want one of Public, Namespace)`},
		{"lb preference", "services:\n- {namespace: ns, hostname: h, loadBalancer: {routingPreferences: [Planet]}}\n", `test.yaml:2:68: services[0].loadBalancer.routingPreferences[0]: unknown value "Planet" (want one of Region, Zone, Subzone, Node, Cluster, Network)`},
		{"lb mode", "services:\n- {namespace: ns, hostname: h, loadBalancer: {mode: RoundRobin}}\n", `test.yaml:2:53: services[0].loadBalancer.mode: unknown value "RoundRobin" (want one of Standard, Strict, Failover, Passthrough)`},
		{"lb health", "services:\n- {namespace: ns, hostname: h, loadBalancer: {healthPolicy: Some}}\n", `test.yaml:2:61: services[0].loadBalancer.healthPolicy: unknown value "Some" (want one of OnlyHealthy, AllowAll)`},
		{"weighted unknown key", "services:\n- {namespace: ns, hostname: h, weightedWaypoints: [{destination: ns/w, w: 1}]}\n", "test.yaml:2:72: services[0].weightedWaypoints[0].w: unknown key"},
		{"duplicate service", "services:\n- {namespace: ns, hostname: h}\n- {namespace: ns, hostname: h}\n", `test.yaml:3:3: services[1]: duplicate service "ns/h"`},

		{"policy unknown key", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, when: x}\n", "test.yaml:2:58: policies[0].when: unknown key"},
		{"policy missing scope", "policies:\n- {name: p, namespace: ns, action: Allow}\n", "test.yaml:2:3: policies[0].scope: missing required key"},
		{"policy bad scope", "policies:\n- {name: p, namespace: ns, scope: Cluster, action: Allow}\n", `test.yaml:2:35: policies[0].scope: unknown value "Cluster" (want one of Global, Namespace, WorkloadSelector)`},
		{"policy bad action", "policies:\n- {name: p, namespace: ns, scope: Global, action: Audit}\n", `test.yaml:2:51: policies[0].action: unknown value "Audit" (want one of Allow, Deny)`},
		{"policy rules not nested", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [{namespaces: []}]}\n", "test.yaml:2:66: policies[0].rules[0]: expected a list, got a mapping"},
		{"match unknown key", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{hosts: []}]]]}\n", "test.yaml:2:69: policies[0].rules[0][0][0].hosts: unknown key"},
		{"string match kind", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{namespaces: [{Regex: a.*}]}]]]}\n", `test.yaml:2:83: policies[0].rules[0][0][0].namespaces[0]: unknown value "Regex" (want one of Exact, Prefix, Suffix, Presence)`},
		{"string match bare", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{namespaces: [a]}]]]}\n", `test.yaml:2:82: policies[0].rules[0][0][0].namespaces[0]: expected a single-key mapping {Exact|Prefix|Suffix: string} or {Presence: []}, got "a"`},
		{"string match two keys", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{namespaces: [{Exact: a, Prefix: b}]}]]]}\n", "test.yaml:2:82: policies[0].rules[0][0][0].namespaces[0]: expected a single-key mapping {Exact|Prefix|Suffix: string} or {Presence: []}, got a mapping"},
		{"presence with value", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{principals: [{Presence: [x]}]}]]]}\n", "test.yaml:2:93: policies[0].rules[0][0][0].principals[0].Presence: expected [], got a list"},
		{"bad cidr", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{sourceIps: [10.0.0.0/99]}]]]}\n", `test.yaml:2:81: policies[0].rules[0][0][0].sourceIps[0]: invalid CIDR "10.0.0.0/99"`},
		{"bad match port", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{destinationPorts: [65536]}]]]}\n", "test.yaml:2:88: policies[0].rules[0][0][0].destinationPorts[0]: 65536 out of range (0-65535)"},
		{"sa match missing field", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow, rules: [[[{serviceAccounts: [{namespace: a}]}]]]}\n", "test.yaml:2:87: policies[0].rules[0][0][0].serviceAccounts[0].serviceAccount: missing required key"},
		{"duplicate policy", "policies:\n- {name: p, namespace: ns, scope: Global, action: Allow}\n- {name: p, namespace: ns, scope: Namespace, action: Deny}\n", `test.yaml:3:3: policies[1]: duplicate policy "ns/p"`},
		{"policy ns slash", "policies:\n- {name: p, namespace: a/b, scope: Global, action: Allow}\n", `test.yaml:2:3: policies[0]: rbac: policy "a/b/p": namespace contains '/'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseLocalConfig("test.yaml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("ParseLocalConfig succeeded, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %s\nwant %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("error %T is not a *ConfigError", err)
			}
		})
	}
}

// TestParseLocalConfigAliasBomb: a small document whose aliases expand to
// millions of nodes fails on the node budget instead of eating memory.
func TestParseLocalConfigAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("policies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Allow\n  rules:\n")
	b.WriteString("  - &c [&m [&x {destinationPorts: [1]}" + strings.Repeat(", *x", 30) + "]" + strings.Repeat(", *m", 30) + "]\n")
	b.WriteString(strings.Repeat("  - *c\n", 5000))
	if b.Len() > 64<<10 {
		t.Fatalf("bomb is %d bytes, want a small document", b.Len())
	}
	_, err := ParseLocalConfig("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "document too large") {
		t.Fatalf("error = %v, want the node budget to stop the bomb", err)
	}
}

func TestLoadLocalConfig(t *testing.T) {
	if _, err := LoadLocalConfig(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "xds: local config") {
		t.Errorf("missing file error = %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, maxLocalConfigSize+10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadLocalConfig(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file error = %v", err)
	}
}

// TestLocalhostExample is the SPEC §5.5 example: parse, check and apply.
// (cmd/gozt/internal/configdump round-trips it through the config dump.)
func TestLocalhostExample(t *testing.T) {
	cfg, err := LoadLocalConfig(filepath.Join("testdata", "localhost.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]state.PortMap{"default/example.com": {80: 8080}, "default/example2.com": {80: 8080}}
	want := &LocalConfig{
		Workloads: []*state.Workload{
			{UID: "default/local", Name: "local", Namespace: "default", ServiceAccount: "default",
				Addresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Protocol: state.TunnelHBONE, Node: "local", Services: ports},
			{UID: "default/local-tcp", Name: "local-tcp", Namespace: "default", ServiceAccount: "default",
				Addresses: []netip.Addr{netip.MustParseAddr("127.0.0.2")}, Protocol: state.TunnelNone, Node: "local", Services: ports},
		},
		Services: []*state.Service{
			{Name: "local", Namespace: "default", Hostname: "example.com",
				VIPs:  []state.NetworkAddress{{Address: netip.MustParseAddr("127.10.0.1")}},
				Ports: state.PortMap{80: 8080}, SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/local"}, Canonical: true},
			{Name: "remote", Namespace: "default", Hostname: "example2.com",
				VIPs:  []state.NetworkAddress{{Network: "remote", Address: netip.MustParseAddr("127.10.0.2")}},
				Ports: state.PortMap{80: 8080}},
		},
		Policies: []*rbac.Policy{{Name: "allow-except-9999", Namespace: "default", Scope: rbac.Namespace, Action: rbac.Allow,
			Rules: []rbac.Rule{{Clauses: []rbac.Clause{{Matches: []rbac.Match{{NotDestinationPorts: []uint16{9999}}}}}}}}},
	}
	if diff := cmp.Diff(want, cfg, cmpOpts, cmpopts.IgnoreFields(LocalConfig{}, "Raw")); diff != "" {
		t.Fatalf("localhost.yaml (-want +got):\n%s", diff)
	}

	st := state.NewStore(state.Config{})
	var applyErr error
	st.Update(func(b *state.Batch) { applyErr = cfg.Apply(b) })
	if applyErr != nil {
		t.Fatal(applyErr)
	}
	snap := st.Snapshot()
	if w := snap.WorkloadByIP("", netip.MustParseAddr("127.0.0.1")); w == nil || w.Protocol != state.TunnelHBONE {
		t.Errorf("WorkloadByIP(127.0.0.1) = %v", w)
	}
	s := snap.ServiceByVIP("", netip.MustParseAddr("127.10.0.1"), "default")
	if s == nil || s.Endpoints.Len() != 2 {
		t.Fatalf("ServiceByVIP(127.10.0.1) = %v", s)
	}
	if snap.ServiceByVIP("", netip.MustParseAddr("127.10.0.2"), "default") != nil {
		t.Error("example2.com found on the default network, want only on remote")
	}
	if got := snap.NamespacePolicies("default"); len(got) != 1 {
		t.Errorf("NamespacePolicies(default) = %d policies, want 1", len(got))
	}
	if id := snap.WorkloadByUID("default/local").Identity(); id.String() != "spiffe://cluster.local/ns/default/sa/default" {
		t.Errorf("Identity = %v", id)
	}

	// Raw is the document, JSON-encodable for staticConfig.
	raw, err := json.Marshal(cfg.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"notDestinationPorts":[9999]`) || !strings.Contains(string(raw), `"default/example.com":{"80":8080}`) {
		t.Errorf("Raw = %s", raw)
	}
}

func TestApplyReplacesState(t *testing.T) {
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		_ = b.InsertWorkload(&state.Workload{UID: "old", Namespace: "ns", Addresses: []netip.Addr{netip.MustParseAddr("10.9.9.9")}})
	})
	cfg := mustParse(t, "workloads:\n- {name: a, namespace: ns, workloadIps: [10.0.0.1]}\n")
	var err error
	st.Update(func(b *state.Batch) { err = cfg.Apply(b) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Snapshot().WorkloadByUID("old") != nil || st.Snapshot().WorkloadByUID("ns/a") == nil {
		t.Error("Apply did not replace the previous state")
	}
}

func FuzzParseLocalConfig(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join("testdata", "localhost.yaml")); err == nil {
		f.Add(data)
	}
	f.Add([]byte("workloads:\n- {name: a, namespace: ns, workloadIps: [10.0.0.1], services: {ns/s: {80: 8080}}}\nservices:\n- {namespace: ns, hostname: s, vips: [/10.0.0.1], cidrVips: [/10.0.0.0/8]}\n"))
	f.Add([]byte("policies:\n- {name: p, namespace: ns, scope: Global, action: Deny, rules: [[[{principals: [{Presence: []}], sourceIps: [::ffff:1.2.3.4/120]}]]]}\n"))
	f.Add([]byte("a: &a [1]\nb: *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseLocalConfig("fuzz.yaml", data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error: %q", err)
			}
			return
		}
		if _, err := json.Marshal(cfg.Raw); err != nil {
			t.Fatalf("Raw not JSON-encodable: %v", err)
		}
		st := state.NewStore(state.Config{})
		var applyErr error
		st.Update(func(b *state.Batch) { applyErr = cfg.Apply(b) })
		if applyErr != nil {
			t.Fatalf("accepted config rejected by the store: %v", applyErr)
		}
	})
}
