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
		p.Rules = []rbac.Rule{
			rule(
				clause(rbac.Match{Principals: sms(exact(fmt.Sprintf("cluster.local/ns/team-%d/sa/web", i)))}),
				clause(rbac.Match{DestinationPorts: ports(8080, 9090)})),
			rule(clause(rbac.Match{
				Namespaces: sms(prefix(fmt.Sprintf("team-%d", i))),
				SourceIPs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24)},
			})),
		}
		if i == n-1 {
			p.Action = rbac.Allow
			p.Rules = append(p.Rules, rule(clause(rbac.Match{Principals: sms(exact(clientPrin))})))
		}
		src.add(p)
	}
	return src, t
}

func benchmarkEvaluate(b *testing.B, n int) {
	src, t := benchSource(n)
	c := defaultConn(b)
	if d := rbac.Evaluate(src, t, c); d.Reason != rbac.AllowedByPolicy || d.Policy.Name != fmt.Sprintf("p%d", n-1) {
		b.Fatalf("Evaluate = %v, want allowed by the last policy", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		rbac.Evaluate(src, t, c)
	}
}

func BenchmarkEvaluate10(b *testing.B)    { benchmarkEvaluate(b, 10) }
func BenchmarkEvaluate10000(b *testing.B) { benchmarkEvaluate(b, 10000) }

// BenchmarkEvaluateRealistic is the allocation test's policy set.
func BenchmarkEvaluateRealistic(b *testing.B) {
	src, t := realisticSource()
	c := conn(b, "10.0.0.1:40000", "10.1.0.5:8080", "spiffe://cluster.local/ns/frontend/sa/web")
	b.ReportAllocs()
	for b.Loop() {
		rbac.Evaluate(src, t, c)
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
