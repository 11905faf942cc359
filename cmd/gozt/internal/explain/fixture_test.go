package explain_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// Helpers to write policies compactly.

func exact(v string) rbac.StringMatch  { return rbac.StringMatch{Kind: rbac.Exact, Value: v} }
func prefix(v string) rbac.StringMatch { return rbac.StringMatch{Kind: rbac.Prefix, Value: v} }
func suffix(v string) rbac.StringMatch { return rbac.StringMatch{Kind: rbac.Suffix, Value: v} }

var presence = rbac.StringMatch{Kind: rbac.Presence}

func cidrs(l ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(l))
	for i, s := range l {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// clause returns a clause whose matches are OR'ed.
func clause(ms ...rbac.Match) rbac.Clause { return rbac.Clause{Matches: ms} }

// rule returns a rule whose clauses are AND'ed.
func rule(cs ...rbac.Clause) rbac.Rule { return rbac.Rule{Clauses: cs} }

func policy(ns, name string, scope rbac.Scope, action rbac.Action, rules ...rbac.Rule) *rbac.Policy {
	return &rbac.Policy{Name: name, Namespace: ns, Scope: scope, Action: action, Rules: rules}
}

func pod(ns, name, sa, addr string, refs ...string) *state.Workload {
	return &state.Workload{
		UID: "Kubernetes//Pod/" + ns + "/" + name, Name: name, Namespace: ns,
		ServiceAccount: sa, TrustDomain: "cluster.local", Protocol: state.TunnelHBONE,
		Addresses:             []netip.Addr{netip.MustParseAddr(addr)},
		AuthorizationPolicies: refs,
	}
}

// newStore returns a store holding ws, svcs and ps, failing the test on any
// rejected insert.
func newStore(t testing.TB, ws []*state.Workload, svcs []*state.Service, ps []*rbac.Policy) *state.Store {
	t.Helper()
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		for _, w := range ws {
			errs = append(errs, b.InsertWorkload(w))
		}
		for _, s := range svcs {
			errs = append(errs, b.InsertService(s))
		}
		for _, p := range ps {
			errs = append(errs, b.InsertPolicy(p))
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("build store: %v", err)
	}
	return st
}

// fixtureStore is the live state of the handler tests, and the source of
// testdata/gozt-dump.json.
//
//	10.0.0.10 prod/server  refs prod/allow-frontend
//	10.0.0.20 prod/db      refs prod/db-lockdown (not known)
//	10.0.0.30 dev/open     no policy applies
//	10.96.0.10             VIP of prod/server.prod.svc.cluster.local
func fixtureStore(t testing.TB) *state.Store {
	t.Helper()
	ws := []*state.Workload{
		pod("prod", "server", "server", "10.0.0.10", "prod/allow-frontend"),
		pod("prod", "db", "db", "10.0.0.20", "prod/db-lockdown"),
		pod("dev", "open", "", "10.0.0.30"),
	}
	svcs := []*state.Service{{
		Name: "server", Namespace: "prod", Hostname: "server.prod.svc.cluster.local",
		VIPs:  []state.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.10")}},
		Ports: state.PortMap{80: 8080},
	}}
	ps := []*rbac.Policy{
		policy("prod", "deny-legacy", rbac.Namespace, rbac.Deny,
			rule(clause(rbac.Match{Principals: []rbac.StringMatch{exact("cluster.local/ns/legacy/sa/old")}})),
			rule(clause(rbac.Match{SourceIPs: cidrs("192.168.0.0/16")}))),
		policy("prod", "allow-frontend", rbac.WorkloadSelector, rbac.Allow,
			rule(
				clause(rbac.Match{Principals: []rbac.StringMatch{exact("cluster.local/ns/web/sa/frontend")}}),
				clause(rbac.Match{DestinationPorts: []uint16{8080}}))),
		{
			Name: "audit-all", Namespace: "istio-system", Scope: rbac.Global, Action: rbac.Deny, DryRun: true,
			Rules: []rbac.Rule{rule(clause(rbac.Match{Principals: []rbac.StringMatch{presence}}))},
		},
	}
	return newStore(t, ws, svcs, ps)
}

// ztunnelEquivalentStore holds, as Go values, what testdata/ztunnel-dump.json
// describes; the offline answers from that file must equal the live
// answers from this store.
func ztunnelEquivalentStore(t testing.TB) *state.Store {
	t.Helper()
	server := pod("prod", "server-7d9f-abcde", "server", "10.244.1.10", "prod/allow-web")
	server.WorkloadType = state.WorkloadDeployment
	ws := []*state.Workload{
		pod("legacy", "old-0", "default", "10.244.3.3"),
		pod("prod", "db-0", "db", "10.244.1.20", "prod/db-only-server", "prod/missing-policy"),
		server,
		pod("v6", "api-0", "api", "fd00:10:244::7"),
		pod("web", "frontend-1", "frontend", "10.244.2.5"),
	}
	svcs := []*state.Service{{
		Name: "server", Namespace: "prod", Hostname: "server.prod.svc.cluster.local",
		VIPs:  []state.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.10")}},
		Ports: state.PortMap{80: 8080},
	}}
	ps := []*rbac.Policy{
		{
			Name: "mesh-dryrun", Namespace: "istio-system", Scope: rbac.Global, Action: rbac.Deny, DryRun: true,
			Rules: []rbac.Rule{rule(clause(rbac.Match{Principals: []rbac.StringMatch{presence}}))},
		},
		policy("legacy", "l7-only-deny", rbac.Namespace, rbac.Deny, rule(clause(rbac.Match{}))),
		policy("prod", "allow-web", rbac.WorkloadSelector, rbac.Allow,
			rule(
				clause(rbac.Match{Principals: []rbac.StringMatch{prefix("cluster.local/ns/web/")}}),
				clause(rbac.Match{DestinationPorts: []uint16{8080, 8443}})),
			rule(clause(rbac.Match{ServiceAccounts: []rbac.ServiceAccountMatch{{Namespace: "prod", ServiceAccount: "db"}}}))),
		policy("prod", "db-only-server", rbac.WorkloadSelector, rbac.Allow,
			rule(clause(rbac.Match{
				Principals:          []rbac.StringMatch{exact("cluster.local/ns/prod/sa/server")},
				NotDestinationPorts: []uint16{9999},
			}))),
		policy("prod", "deny-blocked", rbac.Namespace, rbac.Deny,
			rule(clause(
				rbac.Match{SourceIPs: cidrs("192.168.0.0/16")},
				rbac.Match{NotNamespaces: []rbac.StringMatch{exact("prod"), exact("web")}}))),
		policy("v6", "allow-v6-cidr", rbac.Namespace, rbac.Allow,
			rule(clause(rbac.Match{
				SourceIPs:      cidrs("fd00:10:244::/48"),
				DestinationIPs: cidrs("fd00:10:244::7/128"),
				NotPrincipals:  []rbac.StringMatch{suffix("/sa/banned")},
			}))),
	}
	return newStore(t, ws, svcs, ps)
}
