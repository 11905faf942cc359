package rbac_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gozt/gozt/rbac"
)

// benchSource builds n policies that all apply to a workload in "apps":
// 80% namespace-scoped, 10% global, 10% selector-scoped and referenced.
// Policies alternate DENY and ALLOW; each has two rules (principal AND port;
// namespace prefix AND source CIDR) that the benchmark connection fails, except
// the last policy, an ALLOW that matches it. So a decision evaluates every
// policy: the worst case for a set of that size.
func benchSource(n int) (*fakeSource, rbac.Target) {
	src := newFakeSource()
	t := rbac.Target{Namespace: "apps"}
	for i := range n {
		p := &rbac.Policy{Name: fmt.Sprintf("p%d", i), Namespace: "apps", Scope: rbac.Namespace}
		switch i % 10 {
		case 8:
			p.Namespace, p.Scope = "istio-system", rbac.Global
		case 9:
			p.Scope = rbac.WorkloadSelector
			t.PolicyRefs = append(t.PolicyRefs, p.Key())
		}
		if i%2 == 0 {
			p.Action = rbac.Deny
		}
		p.Rules = teamRules(i)
		if i == n-1 {
			p.Action = rbac.Allow
			p.Rules = append(p.Rules, rule(clause(rbac.Match{Principals: sms(exact(clientPrin))})))
		}
		src.add(p)
	}
	return src, t
}

// teamRules are the two rules of policy i in benchSource and meshSource,
// which the benchmark client fails: a principal AND a port; a namespace
// prefix AND a source CIDR.
func teamRules(i int) []rbac.Rule {
	return []rbac.Rule{
		rule(
			clause(rbac.Match{Principals: sms(exact(fmt.Sprintf("cluster.local/ns/team-%d/sa/web", i)))}),
			clause(rbac.Match{DestinationPorts: ports(8080, 9090)})),
		rule(clause(rbac.Match{
			Namespaces: sms(prefix(fmt.Sprintf("team-%d", i))),
			SourceIPs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24)},
		})),
	}
}

// meshSource builds the policies of `gozt bench`'s RBAC scenario
// (bench/mesh.go benchPolicies): n namespace-scoped policies of the shape
// benchSource makes, the last an ALLOW matching the client's service account.
func meshSource(n int) (*fakeSource, rbac.Target) {
	src := newFakeSource()
	for i := range n {
		p := &rbac.Policy{Name: fmt.Sprintf("p%05d", i), Namespace: "apps", Scope: rbac.Namespace}
		if i%2 == 0 {
			p.Action = rbac.Deny
		}
		p.Rules = teamRules(i)
		if i == n-1 {
			p.Action = rbac.Allow
			p.Rules = append(p.Rules, rule(clause(rbac.Match{ServiceAccounts: sas(sa("client-ns", "client-sa"))})))
		}
		src.add(p)
	}
	return src, rbac.Target{Namespace: "apps"}
}

// How a benchmark hands its policies to Evaluate.
const (
	linear      = false // a plain Source: every policy is matched
	throughSets = true  // a SetSource: only the index's candidates are
)

func benchmarkEvaluate(b *testing.B, src *fakeSource, t rbac.Target, sets bool) {
	var s rbac.Source = src
	if sets {
		s = src.throughNewSetFrom()
	}
	c := defaultConn(b)
	if d := rbac.Evaluate(s, t, c); d.Reason != rbac.AllowedByPolicy || d != rbac.Evaluate(src, t, c) {
		b.Fatalf("Evaluate = %v, want allowed by the last policy, as linearly", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		rbac.Evaluate(s, t, c)
	}
}

func evaluateN(b *testing.B, n int, sets bool) {
	src, t := benchSource(n)
	benchmarkEvaluate(b, src, t, sets)
}

// BenchmarkEvaluate10 and BenchmarkEvaluate10000 evaluate benchSource
// through Sets, as state serves policies; 10% of its policies are
// referenced by the workload, and references are matched one by one.
func BenchmarkEvaluate10(b *testing.B)          { evaluateN(b, 10, throughSets) }
func BenchmarkEvaluate10000(b *testing.B)       { evaluateN(b, 10000, throughSets) }
func BenchmarkEvaluateLinear10(b *testing.B)    { evaluateN(b, 10, linear) }
func BenchmarkEvaluateLinear10000(b *testing.B) { evaluateN(b, 10000, linear) }

// BenchmarkEvaluateMesh10000 is `gozt bench`'s RBAC scenario's policy set:
// all namespace-scoped, so all indexed.
func BenchmarkEvaluateMesh10000(b *testing.B) {
	src, t := meshSource(10000)
	benchmarkEvaluate(b, src, t, throughSets)
}

func BenchmarkEvaluateMeshLinear10000(b *testing.B) {
	src, t := meshSource(10000)
	benchmarkEvaluate(b, src, t, linear)
}

// BenchmarkNewSet10000 is the index build of a 10,000-policy namespace,
// done once per store batch that changes it.
func BenchmarkNewSet10000(b *testing.B) {
	src, t := meshSource(10000)
	ps := src.NamespacePolicies(t.Namespace)
	b.ReportAllocs()
	for b.Loop() {
		rbac.NewSetFrom(nil, ps)
	}
}

// BenchmarkEvaluateRealistic is the allocation test's policy set.
func BenchmarkEvaluateRealistic(b *testing.B) {
	src, t := realisticSource()
	c := conn(b, "10.0.0.1:40000", "10.1.0.5:8080", "spiffe://cluster.local/ns/frontend/sa/web")
	s := src.throughNewSetFrom()
	b.ReportAllocs()
	for b.Loop() {
		rbac.Evaluate(s, t, c)
	}
}

func BenchmarkExplain10(b *testing.B) {
	src, t := benchSource(10)
	c := defaultConn(b)
	b.ReportAllocs()
	for b.Loop() {
		rbac.Explain(src, t, c)
	}
}
