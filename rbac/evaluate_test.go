package rbac_test

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/rbac"
)

// TestMatchFields is the truth table for every Match field and its not_
// twin (TESTPLAN S2, 55, 56). Each case runs twice: as the only rule of an
// ALLOW policy (allowed iff the match holds) and of a DENY policy (denied iff
// it holds).
func TestMatchFields(t *testing.T) {
	const (
		otherTD   = "spiffe://other.td/ns/client-ns/sa/client-sa"
		nsDotA    = "spiffe://cluster.local/ns/ns.a/sa/sa"
		nsXa      = "spiffe://cluster.local/ns/nsXa/sa/sa"
		nsAB      = "spiffe://cluster.local/ns/ab/sa/client-sa"
		v6src     = "[2001:db8::1]:40000"
		v6dst     = "[2001:db8:1::5]:8080"
		mappedSrc = "[::ffff:10.0.0.1]:40000"
		zonedSrc  = "[fe80::1%eth0]:40000"
	)
	tests := []struct {
		name          string
		m             rbac.Match
		src, dst, id  string // "" means the default (id: "-" means none)
		want          bool
		wantFieldsNil bool
	}{
		// namespaces: compared with the identity's namespace ("" without one).
		{name: "ns/exact", m: rbac.Match{Namespaces: sms(exact("client-ns"))}, want: true},
		{name: "ns/exact-other", m: rbac.Match{Namespaces: sms(exact("other"))}},
		{name: "ns/exact-case", m: rbac.Match{Namespaces: sms(exact("Client-ns"))}},
		{name: "ns/prefix", m: rbac.Match{Namespaces: sms(prefix("client"))}, want: true},
		{name: "ns/prefix-longer", m: rbac.Match{Namespaces: sms(prefix("client-ns-x"))}},
		{name: "ns/suffix", m: rbac.Match{Namespaces: sms(suffix("-ns"))}, want: true},
		{name: "ns/suffix-miss", m: rbac.Match{Namespaces: sms(suffix("ns-"))}},
		{name: "ns/presence", m: rbac.Match{Namespaces: sms(presence())}, want: true},
		{name: "ns/presence-no-id", m: rbac.Match{Namespaces: sms(presence())}, id: "-"},
		{name: "ns/exact-empty-no-id", m: rbac.Match{Namespaces: sms(exact(""))}, id: "-", want: true},
		{name: "ns/prefix-empty-no-id", m: rbac.Match{Namespaces: sms(prefix(""))}, id: "-", want: true},
		{name: "ns/any-of", m: rbac.Match{Namespaces: sms(exact("x"), exact("client-ns"))}, want: true},
		{name: "ns/dot-literal", m: rbac.Match{Namespaces: sms(exact("ns.a"))}, id: nsXa},
		{name: "ns/dot-exact", m: rbac.Match{Namespaces: sms(exact("ns.a"))}, id: nsDotA, want: true},
		{name: "ns/dot-prefix-literal", m: rbac.Match{Namespaces: sms(prefix("ns."))}, id: nsXa},
		{name: "ns/dot-suffix-literal", m: rbac.Match{Namespaces: sms(suffix(".a"))}, id: nsXa},
		{name: "ns/star-literal", m: rbac.Match{Namespaces: sms(exact("*"))}},
		{name: "ns/star-prefix-literal", m: rbac.Match{Namespaces: sms(prefix("*"))}},
		{name: "ns/regex-literal", m: rbac.Match{Namespaces: sms(exact("client-.*"))}},
		{name: "not_ns/hit", m: rbac.Match{NotNamespaces: sms(exact("client-ns"))}},
		{name: "not_ns/miss", m: rbac.Match{NotNamespaces: sms(exact("other"))}, want: true},
		{name: "not_ns/any-of", m: rbac.Match{NotNamespaces: sms(exact("other"), prefix("client"))}},
		{name: "not_ns/presence-no-id", m: rbac.Match{NotNamespaces: sms(presence())}, id: "-", want: true},
		{name: "not_ns/exact-empty-no-id", m: rbac.Match{NotNamespaces: sms(exact(""))}, id: "-"},
		{name: "not_ns/dot-literal", m: rbac.Match{NotNamespaces: sms(exact("ns.a"))}, id: nsXa, want: true},

		// principals: the identity without "spiffe://"; none without identity.
		{name: "prin/exact", m: rbac.Match{Principals: sms(exact(clientPrin))}, want: true},
		{name: "prin/exact-with-scheme", m: rbac.Match{Principals: sms(exact(clientID))}},
		{name: "prin/exact-trailing-slash", m: rbac.Match{Principals: sms(exact(clientPrin + "/"))}},
		{name: "prin/exact-short", m: rbac.Match{Principals: sms(exact("cluster.local/ns/client-ns/sa/client-s"))}},
		{name: "prin/exact-other-td", m: rbac.Match{Principals: sms(exact(clientPrin))}, id: otherTD},
		{name: "prin/prefix-ns", m: rbac.Match{Principals: sms(prefix("cluster.local/ns/client-ns/"))}, want: true},
		{name: "prin/prefix-mid-piece", m: rbac.Match{Principals: sms(prefix("cluster.local/ns/cli"))}, want: true},
		{name: "prin/prefix-td", m: rbac.Match{Principals: sms(prefix("cluster.local/"))}, want: true},
		{name: "prin/prefix-boundary", m: rbac.Match{Principals: sms(prefix("cluster.local/ns/a/"))}, id: nsAB},
		{name: "prin/prefix-whole", m: rbac.Match{Principals: sms(prefix(clientPrin))}, want: true},
		{name: "prin/prefix-too-long", m: rbac.Match{Principals: sms(prefix(clientPrin + "x"))}},
		{name: "prin/prefix-empty", m: rbac.Match{Principals: sms(prefix(""))}, want: true},
		{name: "prin/suffix-sa", m: rbac.Match{Principals: sms(suffix("/sa/client-sa"))}, want: true},
		{name: "prin/suffix-across", m: rbac.Match{Principals: sms(suffix("client-ns/sa/client-sa"))}, want: true},
		{name: "prin/suffix-whole", m: rbac.Match{Principals: sms(suffix(clientPrin))}, want: true},
		{name: "prin/suffix-too-long", m: rbac.Match{Principals: sms(suffix("x" + clientPrin))}},
		{name: "prin/suffix-miss", m: rbac.Match{Principals: sms(suffix("xclient-sa"))}},
		{name: "prin/presence", m: rbac.Match{Principals: sms(presence())}, want: true},
		{name: "prin/presence-no-id", m: rbac.Match{Principals: sms(presence())}, id: "-"},
		{name: "prin/exact-empty-no-id", m: rbac.Match{Principals: sms(exact(""))}, id: "-"},
		{name: "prin/prefix-empty-no-id", m: rbac.Match{Principals: sms(prefix(""))}, id: "-"},
		{name: "prin/dot-literal", m: rbac.Match{Principals: sms(exact("cluster.local/ns/ns.a/sa/sa"))}, id: nsXa},
		{name: "prin/dot-exact", m: rbac.Match{Principals: sms(exact("cluster.local/ns/ns.a/sa/sa"))}, id: nsDotA, want: true},
		{name: "prin/star-literal", m: rbac.Match{Principals: sms(exact("cluster.local/ns/*/sa/client-sa"))}},
		{name: "prin/star-prefix-literal", m: rbac.Match{Principals: sms(prefix("cluster.local/ns/*"))}},
		{name: "prin/any-of", m: rbac.Match{Principals: sms(exact("x"), suffix("/sa/client-sa"))}, want: true},
		{name: "not_prin/hit", m: rbac.Match{NotPrincipals: sms(exact(clientPrin))}},
		{name: "not_prin/miss", m: rbac.Match{NotPrincipals: sms(exact("cluster.local/ns/x/sa/y"))}, want: true},
		{name: "not_prin/presence", m: rbac.Match{NotPrincipals: sms(presence())}},
		{name: "not_prin/presence-no-id", m: rbac.Match{NotPrincipals: sms(presence())}, id: "-", want: true},
		{name: "not_prin/prefix-empty-no-id", m: rbac.Match{NotPrincipals: sms(prefix(""))}, id: "-", want: true},
		{name: "not_prin/boundary", m: rbac.Match{NotPrincipals: sms(prefix("cluster.local/ns/a/"))}, id: nsAB, want: true},

		// source_ips.
		{name: "src/v4", m: rbac.Match{SourceIPs: cidrs("10.0.0.0/8")}, want: true},
		{name: "src/v4-host", m: rbac.Match{SourceIPs: cidrs("10.0.0.1/32")}, want: true},
		{name: "src/v4-other-host", m: rbac.Match{SourceIPs: cidrs("10.0.0.2/32")}},
		{name: "src/v4-miss", m: rbac.Match{SourceIPs: cidrs("11.0.0.0/8")}},
		{name: "src/v4-host-bits-set", m: rbac.Match{SourceIPs: cidrs("10.99.0.7/8")}, want: true},
		{name: "src/v4-all", m: rbac.Match{SourceIPs: cidrs("0.0.0.0/0")}, want: true},
		{name: "src/v4-any-of", m: rbac.Match{SourceIPs: cidrs("11.0.0.0/8", "10.0.0.0/24")}, want: true},
		{name: "src/v6", m: rbac.Match{SourceIPs: cidrs("2001:db8::/32")}, src: v6src, want: true},
		{name: "src/v6-miss", m: rbac.Match{SourceIPs: cidrs("2001:db9::/32")}, src: v6src},
		{name: "src/v6-all", m: rbac.Match{SourceIPs: cidrs("::/0")}, src: v6src, want: true},
		{name: "src/v6-all-not-v4", m: rbac.Match{SourceIPs: cidrs("::/0")}},
		{name: "src/v4-all-not-v6", m: rbac.Match{SourceIPs: cidrs("0.0.0.0/0")}, src: v6src},
		{name: "src/mapped-conn-v4-cidr", m: rbac.Match{SourceIPs: cidrs("10.0.0.0/8")}, src: mappedSrc, want: true},
		{name: "src/mapped-cidr-v4-conn", m: rbac.Match{SourceIPs: cidrs("::ffff:10.0.0.0/104")}, want: true},
		{name: "src/mapped-cidr-miss", m: rbac.Match{SourceIPs: cidrs("::ffff:11.0.0.0/104")}},
		{name: "src/mapped-both", m: rbac.Match{SourceIPs: cidrs("::ffff:10.0.0.1/128")}, src: mappedSrc, want: true},
		{name: "src/mapped-short-cidr-stays-v6", m: rbac.Match{SourceIPs: cidrs("::ffff:0.0.0.0/95")}},
		{name: "src/zone-ignored", m: rbac.Match{SourceIPs: cidrs("fe80::/10")}, src: zonedSrc, want: true},
		{name: "not_src/hit", m: rbac.Match{NotSourceIPs: cidrs("10.0.0.0/8")}},
		{name: "not_src/miss", m: rbac.Match{NotSourceIPs: cidrs("11.0.0.0/8")}, want: true},
		{name: "not_src/mapped-conn", m: rbac.Match{NotSourceIPs: cidrs("10.0.0.0/8")}, src: mappedSrc},
		{name: "not_src/zone", m: rbac.Match{NotSourceIPs: cidrs("fe80::/10")}, src: zonedSrc},
		{name: "not_src/v6-vs-v4", m: rbac.Match{NotSourceIPs: cidrs("0.0.0.0/0")}, src: v6src, want: true},

		// destination_ips.
		{name: "dst/v4", m: rbac.Match{DestinationIPs: cidrs("10.1.0.0/16")}, want: true},
		{name: "dst/v4-miss", m: rbac.Match{DestinationIPs: cidrs("10.0.0.0/16")}},
		{name: "dst/is-not-src", m: rbac.Match{DestinationIPs: cidrs("10.0.0.1/32")}},
		{name: "dst/v6", m: rbac.Match{DestinationIPs: cidrs("2001:db8:1::/48")}, dst: v6dst, want: true},
		{name: "dst/v6-miss", m: rbac.Match{DestinationIPs: cidrs("2001:db8:2::/48")}, dst: v6dst},
		{name: "dst/mapped", m: rbac.Match{DestinationIPs: cidrs("10.1.0.5/32")}, dst: "[::ffff:10.1.0.5]:8080", want: true},
		{name: "not_dst/hit", m: rbac.Match{NotDestinationIPs: cidrs("10.1.0.5/32")}},
		{name: "not_dst/miss", m: rbac.Match{NotDestinationIPs: cidrs("10.2.0.0/16")}, want: true},

		// destination_ports: the resolved target port; 15008 is not special.
		{name: "port/hit", m: rbac.Match{DestinationPorts: ports(8080)}, want: true},
		{name: "port/miss", m: rbac.Match{DestinationPorts: ports(80)}},
		{name: "port/any-of", m: rbac.Match{DestinationPorts: ports(80, 8080)}, want: true},
		{name: "port/15008-not-implied", m: rbac.Match{DestinationPorts: ports(15008)}},
		{name: "port/15008-literal", m: rbac.Match{DestinationPorts: ports(15008)}, dst: "10.1.0.5:15008", want: true},
		{name: "not_port/hit", m: rbac.Match{NotDestinationPorts: ports(8080)}},
		{name: "not_port/miss", m: rbac.Match{NotDestinationPorts: ports(80, 15008)}, want: true},

		// service_accounts: namespace + name exact, trust domain ignored.
		{name: "sa/hit", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "client-sa"))}, want: true},
		{name: "sa/other-td", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "client-sa"))}, id: otherTD, want: true},
		{name: "sa/other-name", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "other"))}},
		{name: "sa/other-ns", m: rbac.Match{ServiceAccounts: sas(sa("other", "client-sa"))}},
		{name: "sa/prefix-not-enough", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "client"))}},
		{name: "sa/no-id", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "client-sa"))}, id: "-"},
		{name: "sa/empty-no-id", m: rbac.Match{ServiceAccounts: sas(sa("", ""))}, id: "-"},
		{name: "sa/dot-literal", m: rbac.Match{ServiceAccounts: sas(sa("ns.a", "sa"))}, id: nsXa},
		{name: "sa/dot-exact", m: rbac.Match{ServiceAccounts: sas(sa("ns.a", "sa"))}, id: nsDotA, want: true},
		{name: "sa/star-literal", m: rbac.Match{ServiceAccounts: sas(sa("client-ns", "*"))}},
		{name: "not_sa/hit", m: rbac.Match{NotServiceAccounts: sas(sa("client-ns", "client-sa"))}},
		{name: "not_sa/miss", m: rbac.Match{NotServiceAccounts: sas(sa("client-ns", "x"))}, want: true},
		{name: "not_sa/no-id", m: rbac.Match{NotServiceAccounts: sas(sa("client-ns", "client-sa"))}, id: "-", want: true},

		// Fields of one Match are AND'ed.
		{name: "and/both", m: rbac.Match{Principals: sms(exact(clientPrin)), DestinationPorts: ports(8080)}, want: true},
		{name: "and/one-fails", m: rbac.Match{Principals: sms(exact(clientPrin)), DestinationPorts: ports(9090)}},
		{name: "and/not-fails", m: rbac.Match{Principals: sms(exact(clientPrin)), NotSourceIPs: cidrs("10.0.0.0/8")}},
		{name: "and/all-fields", m: rbac.Match{
			Namespaces: sms(exact("client-ns")), NotNamespaces: sms(exact("x")),
			Principals: sms(exact(clientPrin)), NotPrincipals: sms(exact("x")),
			SourceIPs: cidrs("10.0.0.0/8"), NotSourceIPs: cidrs("11.0.0.0/8"),
			DestinationIPs: cidrs("10.1.0.0/16"), NotDestinationIPs: cidrs("11.0.0.0/8"),
			DestinationPorts: ports(8080), NotDestinationPorts: ports(80),
			ServiceAccounts: sas(sa("client-ns", "client-sa")), NotServiceAccounts: sas(sa("x", "y")),
		}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst, id := or(tt.src, srcDefault), or(tt.dst, dstDefault), or(tt.id, clientID)
			if id == "-" {
				id = ""
			}
			c := conn(t, src, dst, id)
			for _, action := range []rbac.Action{rbac.Allow, rbac.Deny} {
				p := oneMatch(action, tt.m)
				d := evaluate(t, newFakeSource(p), rbac.Target{Namespace: targetNS}, c)
				if got, want := d.Allow, tt.want == (action == rbac.Allow); got != want {
					t.Errorf("%v policy: Evaluate(%+v).Allow = %v (%v), want %v", action, c, got, d, want)
				}
				if tt.want && d.Match != tt.m.Fields() {
					t.Errorf("%v policy: Decision.Match = %v, want %v", action, d.Match, tt.m.Fields())
				}
			}
		})
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestScopes checks which policies apply (SPEC §4.2, TESTPLAN 53, 57).
func TestScopes(t *testing.T) {
	denyAll := func(ns, name string, scope rbac.Scope) *rbac.Policy {
		return policy(ns, name, scope, rbac.Deny, rule())
	}
	tests := []struct {
		name   string
		p      *rbac.Policy
		target rbac.Target
		denied bool
	}{
		{"namespace/same", denyAll("dst", "p", rbac.Namespace), rbac.Target{Namespace: "dst"}, true},
		{"namespace/other", denyAll("other", "p", rbac.Namespace), rbac.Target{Namespace: "dst"}, false},
		{"namespace/referenced-from-other-ns", denyAll("other", "p", rbac.Namespace),
			rbac.Target{Namespace: "dst", PolicyRefs: []string{"other/p"}}, true},
		{"global/any-ns", denyAll("istio-system", "p", rbac.Global), rbac.Target{Namespace: "dst"}, true},
		{"global/own-ns", denyAll("dst", "p", rbac.Global), rbac.Target{Namespace: "other"}, true},
		{"selector/unreferenced", denyAll("dst", "p", rbac.WorkloadSelector), rbac.Target{Namespace: "dst"}, false},
		{"selector/referenced", denyAll("dst", "p", rbac.WorkloadSelector),
			rbac.Target{Namespace: "dst", PolicyRefs: []string{"dst/p"}}, true},
		{"selector/other-name-referenced", denyAll("dst", "p", rbac.WorkloadSelector),
			rbac.Target{Namespace: "dst", PolicyRefs: []string{"dst/q"}}, true}, // unknown ref: fail closed
		{"selector/referenced-by-key-not-name", denyAll("dst", "p", rbac.WorkloadSelector),
			rbac.Target{Namespace: "other", PolicyRefs: []string{"dst/p"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := evaluate(t, newFakeSource(tt.p), tt.target, defaultConn(t))
			if d.Allow == tt.denied {
				t.Errorf("Evaluate = %v, want denied=%v", d, tt.denied)
			}
		})
	}
}

// TestOrder checks evaluation order and precedence (SPEC §4.3, TESTPLAN 52,
// 53, 54, 57, S6).
func TestOrder(t *testing.T) {
	matchAll := rule() // a rule without clauses matches
	prinX := rule(clause(rbac.Match{Principals: sms(exact("cluster.local/ns/x/sa/x"))}))
	withDryRun := func(p *rbac.Policy) *rbac.Policy { p.DryRun = true; return p }

	nsAllow := policy("dst", "ns-allow", rbac.Namespace, rbac.Allow, matchAll)
	nsDeny := policy("dst", "ns-deny", rbac.Namespace, rbac.Deny, matchAll)
	rootDeny := policy("istio-system", "root-deny", rbac.Global, rbac.Deny, matchAll)
	wlAllow := policy("dst", "wl-allow", rbac.WorkloadSelector, rbac.Allow, matchAll)
	wlDeny := policy("dst", "wl-deny", rbac.WorkloadSelector, rbac.Deny, matchAll)
	allowX := policy("dst", "allow-x", rbac.Namespace, rbac.Allow, prinX)
	allowAnyID := policy("dst", "allow-any-id", rbac.Namespace, rbac.Allow,
		rule(clause(rbac.Match{Principals: sms(presence())})))
	dryDeny := withDryRun(policy("dst", "dry-deny", rbac.Namespace, rbac.Deny, matchAll))
	dryAllow := withDryRun(policy("dst", "dry-allow", rbac.Namespace, rbac.Allow, matchAll))
	dryAllowX := withDryRun(policy("dst", "dry-allow-x", rbac.Namespace, rbac.Allow, prinX))

	type want struct {
		Allow   bool
		Reason  rbac.Reason
		Policy  string
		Missing string
	}
	tests := []struct {
		name     string
		policies []*rbac.Policy
		refs     []string
		noID     bool
		want     want
	}{
		{"none", nil, nil, false, want{true, rbac.AllowedNoPolicies, "", ""}},
		{"allow-matches", []*rbac.Policy{nsAllow}, nil, false, want{true, rbac.AllowedByPolicy, "dst/ns-allow", ""}},
		{"52/allow-other-principal", []*rbac.Policy{allowX}, nil, false,
			want{false, rbac.DeniedNoAllowMatched, "", ""}},
		{"53/deny-beats-allow-ns", []*rbac.Policy{nsAllow, nsDeny}, nil, false,
			want{false, rbac.DeniedByPolicy, "dst/ns-deny", ""}},
		{"53/root-deny-beats-workload-allow", []*rbac.Policy{rootDeny, wlAllow}, []string{"dst/wl-allow"}, false,
			want{false, rbac.DeniedByPolicy, "istio-system/root-deny", ""}},
		{"53/workload-deny-beats-ns-allow", []*rbac.Policy{nsAllow, wlDeny}, []string{"dst/wl-deny"}, false,
			want{false, rbac.DeniedByPolicy, "dst/wl-deny", ""}},
		{"deny-order/namespace-first", []*rbac.Policy{wlDeny, rootDeny, nsDeny}, []string{"dst/wl-deny"}, false,
			want{false, rbac.DeniedByPolicy, "dst/ns-deny", ""}},
		{"deny-order/global-before-ref", []*rbac.Policy{wlDeny, rootDeny}, []string{"dst/wl-deny"}, false,
			want{false, rbac.DeniedByPolicy, "istio-system/root-deny", ""}},
		{"54/allow-exists-no-identity", []*rbac.Policy{allowAnyID}, nil, true,
			want{false, rbac.DeniedNoAllowMatched, "", ""}},
		{"57/dry-run-deny-never-denies", []*rbac.Policy{dryDeny}, nil, false,
			want{true, rbac.AllowedNoPolicies, "", ""}},
		{"dry-run-allow-is-no-allow-policy", []*rbac.Policy{dryAllowX}, nil, false,
			want{true, rbac.AllowedNoPolicies, "", ""}},
		{"dry-run-allow-never-allows", []*rbac.Policy{dryAllow, allowX}, nil, false,
			want{false, rbac.DeniedNoAllowMatched, "", ""}},
		{"S6/unknown-ref-denies", nil, []string{"dst/p1"}, false,
			want{false, rbac.DeniedUnknownPolicy, "", "dst/p1"}},
		{"S6/unknown-ref-beats-allow", []*rbac.Policy{nsAllow, wlAllow}, []string{"dst/wl-allow", "dst/p1"}, false,
			want{false, rbac.DeniedUnknownPolicy, "", "dst/p1"}},
		{"S6/first-unknown-reported", nil, []string{"dst/p1", "dst/p2"}, false,
			want{false, rbac.DeniedUnknownPolicy, "", "dst/p1"}},
		{"S6/explicit-deny-reported-first", []*rbac.Policy{wlDeny}, []string{"dst/p1", "dst/wl-deny"}, false,
			want{false, rbac.DeniedByPolicy, "dst/wl-deny", ""}},
		{"ref-to-scoped-policy", []*rbac.Policy{nsDeny}, []string{"dst/ns-deny"}, false,
			want{false, rbac.DeniedByPolicy, "dst/ns-deny", ""}},
		{"duplicate-ref", []*rbac.Policy{wlAllow}, []string{"dst/wl-allow", "dst/wl-allow"}, false,
			want{true, rbac.AllowedByPolicy, "dst/wl-allow", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := defaultConn(t)
			if tt.noID {
				c = conn(t, srcDefault, dstDefault, "")
			}
			d := evaluate(t, newFakeSource(tt.policies...), rbac.Target{Namespace: "dst", PolicyRefs: tt.refs}, c)
			got := want{Allow: d.Allow, Reason: d.Reason, Missing: d.Missing}
			if d.Policy != nil {
				got.Policy = d.Policy.Key()
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Evaluate = %v; (-want +got):\n%s", d, diff)
			}
			if (d.Policy == nil) != (d.Rule == -1) {
				t.Errorf("Evaluate: Policy %v with Rule %d", d.Policy, d.Rule)
			}
		})
	}
}

// TestEmpty checks empty policies, rules, clauses and matches, including
// what istiod sends for L7-only policies (TESTPLAN S1, S7, 40).
func TestEmpty(t *testing.T) {
	empty := rbac.Match{}
	prin := rbac.Match{Principals: sms(exact(clientPrin))}
	otherPrin := rbac.Match{Principals: sms(exact("cluster.local/ns/x/sa/x"))}
	port := rbac.Match{DestinationPorts: ports(8080)}
	tests := []struct {
		name      string
		action    rbac.Action
		rules     []rbac.Rule
		matches   bool // whether the policy matches the default connection
		wantMatch rbac.Fields
	}{
		{"allow/no-rules", rbac.Allow, nil, false, 0},
		{"deny/no-rules", rbac.Deny, nil, false, 0},
		{"allow/rule-no-clauses", rbac.Allow, []rbac.Rule{rule()}, true, 0},
		{"deny/rule-no-clauses", rbac.Deny, []rbac.Rule{rule()}, true, 0},
		{"allow/clause-no-matches", rbac.Allow, []rbac.Rule{rule(clause())}, true, 0},
		{"deny/clause-no-matches", rbac.Deny, []rbac.Rule{rule(clause())}, true, 0},
		{"allow/clause-no-matches-and-prin", rbac.Allow, []rbac.Rule{rule(clause(), clause(prin))}, true, rbac.FieldPrincipals},
		{"allow/S7-empty-match-never", rbac.Allow, []rbac.Rule{rule(clause(empty))}, false, 0},
		{"allow/empty-match-skipped", rbac.Allow, []rbac.Rule{rule(clause(empty, port))}, true, rbac.FieldDestinationPorts},
		{"allow/empty-match-in-and", rbac.Allow, []rbac.Rule{rule(clause(prin), clause(empty))}, false, 0},
		{"deny/S1-empty-match-holds", rbac.Deny, []rbac.Rule{rule(clause(empty))}, true, rbac.FieldEmptyMatch},
		// DENY {from: principal X, when: request.headers[...]} arrives as
		// clauses [principal X] AND [empty]: the L7 condition is dropped,
		// the source restriction stays.
		{"deny/S1-l7-condition-dropped-hit", rbac.Deny, []rbac.Rule{rule(clause(prin), clause(empty))}, true,
			rbac.FieldPrincipals | rbac.FieldEmptyMatch},
		{"deny/S1-l7-condition-dropped-miss", rbac.Deny, []rbac.Rule{rule(clause(otherPrin), clause(empty))}, false, 0},
		// DENY {from: [{principals: X}, {requestPrincipals: Y}]} arrives as
		// one clause [principal X, empty]: without its L7 attribute the
		// second source is "any source", so the clause holds for everyone.
		{"deny/S1-l7-source-alternative", rbac.Deny, []rbac.Rule{rule(clause(otherPrin, empty))}, true, rbac.FieldEmptyMatch},
		{"deny/S1-valid-alternative-first", rbac.Deny, []rbac.Rule{rule(clause(prin, empty))}, true, rbac.FieldPrincipals},
		// Nesting (TESTPLAN S5): rules OR, clauses AND, matches OR.
		{"nest/rules-or", rbac.Allow, []rbac.Rule{rule(clause(otherPrin)), rule(clause(port))}, true, rbac.FieldDestinationPorts},
		{"nest/clauses-and-hit", rbac.Allow, []rbac.Rule{rule(clause(prin), clause(port))}, true,
			rbac.FieldPrincipals | rbac.FieldDestinationPorts},
		{"nest/clauses-and-miss", rbac.Allow, []rbac.Rule{rule(clause(otherPrin), clause(port))}, false, 0},
		{"nest/matches-or", rbac.Allow, []rbac.Rule{rule(clause(otherPrin, port))}, true, rbac.FieldDestinationPorts},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy("dst", "p", rbac.Namespace, tt.action, tt.rules...)
			d := evaluate(t, newFakeSource(p), rbac.Target{Namespace: "dst"}, defaultConn(t))
			var want rbac.Decision
			switch {
			case tt.matches && tt.action == rbac.Allow:
				want = rbac.Decision{Allow: true, Reason: rbac.AllowedByPolicy, Policy: p, Match: tt.wantMatch}
			case tt.matches:
				want = rbac.Decision{Reason: rbac.DeniedByPolicy, Policy: p, Match: tt.wantMatch}
			case tt.action == rbac.Allow:
				want = rbac.Decision{Reason: rbac.DeniedNoAllowMatched, Rule: -1}
			default:
				want = rbac.Decision{Allow: true, Reason: rbac.AllowedNoPolicies, Rule: -1}
			}
			if want.Policy != nil {
				want.Rule = len(tt.rules) - 1 // the matching rule is always the last
			}
			if diff := cmp.Diff(want, d); diff != "" {
				t.Errorf("Evaluate (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCorruptAction checks that an action Validate would reject fails
// closed: it is treated as DENY.
func TestCorruptAction(t *testing.T) {
	p := policy("dst", "p", rbac.Namespace, rbac.Action(7), rule())
	if d := evaluate(t, newFakeSource(p), rbac.Target{Namespace: "dst"}, defaultConn(t)); d.Allow {
		t.Errorf("Evaluate with action 7 = %v, want denied", d)
	}
}

// TestNoHeaderInput documents TESTPLAN S8/S16: authorization has no input
// for anything the client writes in its HBONE request (baggage, Forwarded,
// x-forwarded-network, traceparent), so such values cannot change a
// decision. A new field on Conn must be reviewed against that rule.
func TestNoHeaderInput(t *testing.T) {
	var got []string
	ct := reflect.TypeFor[rbac.Conn]()
	for i := range ct.NumField() {
		got = append(got, ct.Field(i).Name)
	}
	if diff := cmp.Diff([]string{"Src", "Dst", "Identity"}, got); diff != "" {
		t.Errorf("rbac.Conn fields changed (-want +got):\n%s", diff)
	}
}

func TestDecisionString(t *testing.T) {
	p := policy("ns", "name", rbac.Namespace, rbac.Deny)
	tests := []struct {
		d    rbac.Decision
		want string
	}{
		{rbac.Decision{Reason: rbac.DeniedByPolicy, Policy: p, Rule: 0, Match: rbac.FieldPrincipals},
			"denied by policy ns/name rule 0 (principals)"},
		{rbac.Decision{Allow: true, Reason: rbac.AllowedByPolicy, Policy: p, Rule: 2,
			Match: rbac.FieldPrincipals | rbac.FieldNotDestinationPorts},
			"allowed by policy ns/name rule 2 (principals,not_destination_ports)"},
		{rbac.Decision{Reason: rbac.DeniedByPolicy, Policy: p, Rule: 1}, "denied by policy ns/name rule 1 (unconditional)"},
		{rbac.Decision{Reason: rbac.DeniedByPolicy, Policy: p, Match: rbac.FieldEmptyMatch},
			"denied by policy ns/name rule 0 (empty_match)"},
		{rbac.Decision{Reason: rbac.DeniedNoAllowMatched, Rule: -1}, "no ALLOW policy matched"},
		{rbac.Decision{Reason: rbac.DeniedUnknownPolicy, Rule: -1, Missing: "ns/p1"}, "referenced policy ns/p1 unknown"},
		{rbac.Decision{Allow: true, Reason: rbac.AllowedNoPolicies, Rule: -1}, "allowed: no ALLOW policy applies"},
		{rbac.Decision{}, "no decision"},
	}
	for _, tt := range tests {
		if got := tt.d.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestFieldsString(t *testing.T) {
	tests := []struct {
		f    rbac.Fields
		want string
	}{
		{0, ""},
		{rbac.FieldNamespaces, "namespaces"},
		{rbac.FieldNotServiceAccounts | rbac.FieldNamespaces, "namespaces,not_service_accounts"},
		{rbac.FieldEmptyMatch, "empty_match"},
		{1 << 15, "Fields(32768)"},
	}
	for _, tt := range tests {
		if got := tt.f.String(); got != tt.want {
			t.Errorf("Fields(%d).String() = %q, want %q", uint16(tt.f), got, tt.want)
		}
	}
	if got, want := rbac.Reason(0).String(), "Reason(0)"; got != want {
		t.Errorf("Reason(0).String() = %q, want %q", got, want)
	}
}

// TestEvaluateNoAllocs proves the per-connection decision allocates nothing
// (STYLE 38), on every decision path, with IPv4, IPv6 and no identity.
func TestEvaluateNoAllocs(t *testing.T) {
	src, target := realisticSource()
	tests := []struct {
		name string
		c    rbac.Conn
		want rbac.Reason
	}{
		{"allowed", conn(t, "10.0.0.1:40000", "10.1.0.5:8080", "spiffe://cluster.local/ns/frontend/sa/web"),
			rbac.AllowedByPolicy},
		{"allowed-by-suffix", conn(t, "10.0.0.1:40000", "10.1.0.5:8443", "spiffe://cluster.local/ns/ops/sa/admin"),
			rbac.AllowedByPolicy},
		{"denied-by-namespace", conn(t, "10.0.0.1:40000", "10.1.0.5:8080", "spiffe://cluster.local/ns/blocked/sa/web"),
			rbac.DeniedByPolicy},
		{"denied-l7-only", conn(t, "10.0.0.1:40000", "10.1.0.5:8080", "spiffe://cluster.local/ns/scanner/sa/bot"),
			rbac.DeniedByPolicy},
		{"denied-v6-cidr", conn(t, "[2001:db8:dead::1]:40000", "[2001:db8:1::5]:8080", "spiffe://cluster.local/ns/frontend/sa/web"),
			rbac.DeniedByPolicy},
		{"denied-no-identity-mapped", conn(t, "[::ffff:10.0.0.1]:40000", "10.1.0.5:8080", ""), rbac.DeniedByPolicy},
		{"no-allow-matched", conn(t, "[fe80::1%eth0]:40000", "[::ffff:10.1.0.5]:9999", "spiffe://td/ns/frontend/sa/web"),
			rbac.DeniedNoAllowMatched},
	}
	for _, s := range []struct {
		name string
		src  rbac.Source
	}{{"linear", src}, {"indexed sets", src.indexed()}, {"NewSetFrom sets", src.throughNewSetFrom()}} {
		for _, tt := range tests {
			var d rbac.Decision
			allocs := testing.AllocsPerRun(200, func() { d = rbac.Evaluate(s.src, target, tt.c) })
			if allocs != 0 {
				t.Errorf("%s %s: Evaluate allocates %v times per run, want 0", s.name, tt.name, allocs)
			}
			if d.Reason != tt.want {
				t.Errorf("%s %s: Evaluate = %v, want reason %v", s.name, tt.name, d, tt.want)
			}
		}
		unknown := target
		unknown.PolicyRefs = append([]string{"apps/not-yet-received"}, target.PolicyRefs...)
		c := tests[0].c
		var d rbac.Decision
		if allocs := testing.AllocsPerRun(200, func() { d = rbac.Evaluate(s.src, unknown, c) }); allocs != 0 {
			t.Errorf("%s unknown reference: Evaluate allocates %v times per run, want 0", s.name, allocs)
		}
		if d.Reason != rbac.DeniedUnknownPolicy {
			t.Errorf("%s unknown reference: Evaluate = %v, want %v", s.name, d, rbac.DeniedUnknownPolicy)
		}
	}
}
