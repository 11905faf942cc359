package dns

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/state"
)

func testMatcher() *matcher {
	m := &matcher{client: &state.Workload{Namespace: "ns1"}, domain: "cluster.local"}
	m.search = (&Resolver{cfg: Config{ClusterDomain: "cluster.local"}}).searchDomains(m.client)
	return m
}

// TestKubeFQDNs is ztunnel's expansion table by label count.
func TestKubeFQDNs(t *testing.T) {
	m := testMatcher()
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"name", []string{"name.ns1.svc.cluster.local"}},
		{"name.ns2", []string{"name.ns2.svc.cluster.local", "name.ns2.ns1.svc.cluster.local"}},
		{"name.ns2.svc", []string{"name.ns2.svc.cluster.local", "name.ns2.svc.svc.cluster.local"}},
		{"pod.sub.ns2", []string{"pod.sub.ns2.svc.cluster.local"}},
		{"pod.sub.ns2.svc", []string{"pod.sub.ns2.svc.cluster.local"}},
		{"a.b.c.d", nil},
		{"name.ns2.svc.cluster.local", nil},
	} {
		if diff := cmp.Diff(tc.want, m.kubeFQDNs(tc.name)); diff != "" {
			t.Errorf("kubeFQDNs(%q) (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestAliases: the name, its expansions, then each stripped search domain
// and its expansions, each name once.
func TestAliases(t *testing.T) {
	m := testMatcher()
	for _, tc := range []struct {
		name string
		want []alias
	}{
		{"svc", []alias{{name: "svc"}, {name: "svc.ns1.svc.cluster.local"}}},
		{"svc.ns1.svc.cluster.local", []alias{
			{name: "svc.ns1.svc.cluster.local"},
			{name: "svc", stripped: "svc"},
			{name: "svc.ns1", stripped: "svc.ns1"},
			{name: "svc.ns1.ns1.svc.cluster.local", stripped: "svc.ns1"},
			{name: "svc.ns1.svc", stripped: "svc.ns1.svc"},
			{name: "svc.ns1.svc.svc.cluster.local", stripped: "svc.ns1.svc"},
		}},
		{"foo.com.svc.cluster.local", []alias{
			{name: "foo.com.svc.cluster.local"},
			{name: "foo.com", stripped: "foo.com"},
			{name: "foo.com.ns1.svc.cluster.local", stripped: "foo.com"},
			{name: "foo.com.svc", stripped: "foo.com.svc"},
			{name: "foo.com.svc.svc.cluster.local", stripped: "foo.com.svc"},
		}},
		{"cluster.local", []alias{{name: "cluster.local"}, {name: "cluster.local.svc.cluster.local"},
			{name: "cluster.local.ns1.svc.cluster.local"}}},
	} {
		if diff := cmp.Diff(tc.want, m.aliases(tc.name), cmp.AllowUnexported(alias{})); diff != "" {
			t.Errorf("aliases(%q) (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestWildcards(t *testing.T) {
	for name, want := range map[string][]string{
		"www.example.com": {"www.example.com", "*.example.com", "*.com"},
		"com":             {"com"},
		"a.b":             {"a.b", "*.b"},
	} {
		if diff := cmp.Diff(want, wildcards(name)); diff != "" {
			t.Errorf("wildcards(%q) (-want +got):\n%s", name, diff)
		}
	}
}

// TestBestService is ztunnel's ranking fold: the client's namespace at
// once, else the last canonical, else the preferred namespace unless a
// canonical came first, else the first.
func TestBestService(t *testing.T) {
	svc := func(ns string, canonical bool) *state.Service {
		return &state.Service{Namespace: ns, Canonical: canonical}
	}
	a, b, c := svc("a", false), svc("b", false), svc("c", false)
	ca, cb := svc("a", true), svc("b", true)
	client := svc("client", false)
	for _, tc := range []struct {
		name      string
		svcs      []*state.Service
		preferred string
		want      *state.Service
	}{
		{"none", nil, "", nil},
		{"first", []*state.Service{a, b}, "", a},
		{"client namespace", []*state.Service{ca, client, b}, "b", client},
		{"canonical", []*state.Service{a, cb}, "", cb},
		{"last canonical", []*state.Service{ca, cb}, "", cb},
		{"preferred over first", []*state.Service{a, b, c}, "b", b},
		{"canonical over preferred", []*state.Service{b, ca}, "b", ca},
		{"preferred after canonical ignored", []*state.Service{ca, b}, "b", ca},
		{"first after preferred", []*state.Service{b, a}, "b", b},
	} {
		if got := bestService(tc.svcs, "client", tc.preferred); got != tc.want {
			t.Errorf("%s: bestService = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBestPod is ztunnel#1918's ranking of the pods a headless service's
// pod name may mean: the first in the client's namespace and cluster at
// once; else the first in its cluster; else the first in its namespace;
// else the first.
func TestBestPod(t *testing.T) {
	wl := func(ns, cluster string) *state.Workload {
		return &state.Workload{Namespace: ns, ClusterID: cluster}
	}
	here := wl("client", "c1")
	here2 := wl("client", "c1")
	sameCluster, sameCluster2 := wl("other", "c1"), wl("other", "c1")
	sameNS, sameNS2 := wl("client", "c2"), wl("client", "c2")
	elsewhere, elsewhere2 := wl("other", "c2"), wl("other", "c2")
	for _, tc := range []struct {
		name string
		ws   []*state.Workload
		want *state.Workload
	}{
		{"none", nil, nil},
		{"first", []*state.Workload{elsewhere, elsewhere2}, elsewhere},
		{"namespace and cluster", []*state.Workload{sameCluster, sameNS, elsewhere, here, here2}, here},
		{"cluster over namespace", []*state.Workload{sameNS, elsewhere, sameCluster, sameCluster2}, sameCluster},
		{"namespace over first", []*state.Workload{elsewhere, sameNS, sameNS2}, sameNS},
	} {
		if got := bestPod(tc.ws, "client", "c1"); got != tc.want {
			t.Errorf("%s: bestPod = %p, want %p", tc.name, got, tc.want)
		}
	}
}
