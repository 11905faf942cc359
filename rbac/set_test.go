package rbac

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/certs/identity"
)

// These tests look inside a Set: which policies a connection's keys make
// candidates. A candidate set that is too large is only slow, so each case
// also lists policies that must NOT be candidates, proving the index
// narrows; one that is too small is wrong, which the property tests
// (set_property_test.go) catch against the reference evaluator.

// candidateNames returns the names of s's candidates for c, DENY phase then
// ALLOW phase, each in order, or "ALL" when lookup gave up.
func candidateNames(s *Set, c Conn) string {
	if s == nil {
		return ""
	}
	in := newInput(&c)
	var h hits
	s.lookup(&in, &h)
	if h.all {
		return "ALL"
	}
	var out []string
	for _, allow := range []bool{denyPhase, allowPhase} {
		var cur cursor
		cur.init(s, &h, allow)
		for i, ok := cur.next(); ok; i, ok = cur.next() {
			out = append(out, s.policies[i].Name)
		}
	}
	return strings.Join(out, " ")
}

func testConn(tb testing.TB, src, dst, id string) Conn {
	tb.Helper()
	c := Conn{Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)}
	if id != "" {
		c.Identity = identity.MustParse(id)
	}
	return c
}

// allowOne is an ALLOW policy with one rule, one clause, one Match.
func allowOne(name string, m Match) *Policy {
	return &Policy{Name: name, Namespace: "ns", Scope: Namespace, Action: Allow,
		Rules: []Rule{{Clauses: []Clause{{Matches: []Match{m}}}}}}
}

type candidateCase struct {
	name string
	c    Conn
	want string
}

func checkCandidates(t *testing.T, ps []*Policy, tests []candidateCase) {
	t.Helper()
	for _, p := range ps {
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	s := newSetFrom(nil, ps, 0)
	for _, tt := range tests {
		if got := candidateNames(s, tt.c); got != tt.want {
			t.Errorf("%s: candidates %q, want %q", tt.name, got, tt.want)
		}
		// And the decision is the linear one.
		src := &oneSetSource{s}
		if got, want := Evaluate(src, Target{Namespace: "ns"}, tt.c), Evaluate(linearOnly{src}, Target{Namespace: "ns"}, tt.c); got != want {
			t.Errorf("%s: Evaluate through the Set = %v, linear %v", tt.name, got, want)
		}
	}
}

// oneSetSource serves one Set as namespace "ns".
type oneSetSource struct{ s *Set }

func (o *oneSetSource) NamespacePolicies(ns string) []*Policy {
	if ns == "ns" {
		return o.s.Policies()
	}
	return nil
}
func (o *oneSetSource) GlobalPolicies() []*Policy { return nil }
func (o *oneSetSource) Policy(string) *Policy     { return nil }
func (o *oneSetSource) NamespaceSet(ns string) *Set {
	if ns == "ns" {
		return o.s
	}
	return nil
}
func (o *oneSetSource) GlobalSet() *Set { return nil }

// linearOnly hides the SetSource methods.
type linearOnly struct{ Source }

func TestSetPrincipals(t *testing.T) {
	sm := func(k MatchKind, v string) []StringMatch { return []StringMatch{{Kind: k, Value: v}} }
	ps := []*Policy{
		allowOne("exact", Match{Principals: sm(Exact, "cluster.local/ns/a/sa/x")}),
		allowOne("exact-other", Match{Principals: sm(Exact, "cluster.local/ns/a/sa/y")}),
		allowOne("prefix-across-pieces", Match{Principals: sm(Prefix, "cluster.local/ns/a/s")}),
		allowOne("prefix-td", Match{Principals: sm(Prefix, "cluster.local/")}),
		allowOne("prefix-other", Match{Principals: sm(Prefix, "other.td/")}),
		allowOne("suffix", Match{Principals: sm(Suffix, "/sa/x")}),
		allowOne("suffix-across-pieces", Match{Principals: sm(Suffix, "a/sa/x")}),
		allowOne("suffix-other", Match{Principals: sm(Suffix, "/sa/z")}),
		allowOne("prefix-empty", Match{Principals: sm(Prefix, "")}),
		allowOne("suffix-whole", Match{Principals: sm(Suffix, "cluster.local/ns/a/sa/x")}),
		allowOne("suffix-longer", Match{Principals: sm(Suffix, "xcluster.local/ns/a/sa/x")}),
	}
	checkCandidates(t, ps, []candidateCase{
		{"a/x", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://cluster.local/ns/a/sa/x"),
			"exact prefix-across-pieces prefix-td suffix suffix-across-pieces prefix-empty suffix-whole"},
		{"a/y", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://cluster.local/ns/a/sa/y"),
			"exact-other prefix-across-pieces prefix-td prefix-empty"},
		{"other td", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://other.td/ns/b/sa/x"),
			"prefix-other suffix prefix-empty"},
		// Without an identity principals match nothing, not even prefix "".
		{"no identity", testConn(t, "10.0.0.1:1", "10.0.0.2:80", ""), ""},
	})
}

func TestSetNamespaces(t *testing.T) {
	sm := func(k MatchKind, v string) []StringMatch { return []StringMatch{{Kind: k, Value: v}} }
	ps := []*Policy{
		allowOne("exact-a", Match{Namespaces: sm(Exact, "a")}),
		allowOne("exact-empty", Match{Namespaces: sm(Exact, "")}),
		allowOne("prefix-empty", Match{Namespaces: sm(Prefix, "")}),
		allowOne("suffix-empty", Match{Namespaces: sm(Suffix, "")}),
		allowOne("prefix-team", Match{Namespaces: sm(Prefix, "team-")}),
		allowOne("prefix-team-1", Match{Namespaces: sm(Prefix, "team-1")}),
		allowOne("suffix-prod", Match{Namespaces: sm(Suffix, "-prod")}),
		allowOne("exact-and-suffix", Match{Namespaces: []StringMatch{{Kind: Exact, Value: "b"}, {Kind: Suffix, Value: "1-prod"}}}),
	}
	checkCandidates(t, ps, []candidateCase{
		{"a", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/a/sa/x"), "exact-a prefix-empty suffix-empty"},
		{"team-10-prod", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/team-10-prod/sa/x"),
			"prefix-empty suffix-empty prefix-team prefix-team-1 suffix-prod"},
		{"team-1-prod", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/team-1-prod/sa/x"),
			"prefix-empty suffix-empty prefix-team prefix-team-1 suffix-prod exact-and-suffix"},
		{"b", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/b/sa/x"), "prefix-empty suffix-empty exact-and-suffix"},
		// Without an identity the namespace is "": exact "" and the empty
		// prefix and suffix hold.
		{"no identity", testConn(t, "10.0.0.1:1", "10.0.0.2:80", ""), "exact-empty prefix-empty suffix-empty"},
	})
}

func TestSetServiceAccountsAndPorts(t *testing.T) {
	ps := []*Policy{
		allowOne("sa-a-x", Match{ServiceAccounts: []ServiceAccountMatch{{Namespace: "a", ServiceAccount: "x"}}}),
		// "a" + "x/y" and "a/x" + "y" must not be confused (they may
		// collide in a hash, which only adds a candidate; here they do not).
		allowOne("sa-ax-y", Match{ServiceAccounts: []ServiceAccountMatch{{Namespace: "a/x", ServiceAccount: "y"}}}),
		allowOne("port-80", Match{DestinationPorts: []uint16{80, 443}}),
		allowOne("port-0", Match{DestinationPorts: []uint16{0}}),
	}
	checkCandidates(t, ps, []candidateCase{
		{"a/x to 80", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/a/sa/x"), "sa-a-x port-80"},
		{"a/y to 443", testConn(t, "10.0.0.1:1", "10.0.0.2:443", "spiffe://td/ns/a/sa/y"), "port-80"},
		{"no identity to 0", testConn(t, "10.0.0.1:1", "10.0.0.2:0", ""), "port-0"},
	})
}

func TestSetCIDRs(t *testing.T) {
	src := func(name string, cidrs ...string) *Policy {
		var ps []netip.Prefix
		for _, c := range cidrs {
			ps = append(ps, netip.MustParsePrefix(c))
		}
		return allowOne(name, Match{SourceIPs: ps})
	}
	ps := []*Policy{
		src("v4-8", "10.0.0.0/8"),
		src("v4-32", "10.0.0.1/32"),
		src("v4-host-bits", "10.9.9.9/16"), // = 10.9.0.0/16
		src("mapped-104", "::ffff:10.0.0.0/104"),
		src("mapped-95", "::ffff:0.0.0.0/95"), // IPv6: never an IPv4 address
		src("v4-any", "0.0.0.0/0"),
		src("v6-any", "::/0"),
		src("v6-32", "2001:db8::/32"),
		src("link-local", "fe80::/10"),
		src("other", "192.168.0.0/16", "2001:db9::/32"),
		allowOne("dst-v4", Match{DestinationIPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}),
	}
	checkCandidates(t, ps, []candidateCase{
		{"10.0.0.1", testConn(t, "10.0.0.1:1", "10.1.0.5:80", ""), "v4-8 v4-32 mapped-104 v4-any dst-v4"},
		{"mapped 10.0.0.1", testConn(t, "[::ffff:10.0.0.1]:1", "[::ffff:10.1.0.5]:80", ""), "v4-8 v4-32 mapped-104 v4-any dst-v4"},
		{"10.9.1.1", testConn(t, "10.9.1.1:1", "10.2.0.5:80", ""), "v4-8 v4-host-bits mapped-104 v4-any"},
		{"11.0.0.1", testConn(t, "11.0.0.1:1", "[2001:db8::5]:80", ""), "v4-any"},
		{"2001:db8::1", testConn(t, "[2001:db8::1]:1", "10.1.0.5:80", ""), "v6-any v6-32 dst-v4"},
		{"fe80::1%eth0", testConn(t, "[fe80::1%eth0]:1", "10.3.0.5:80", ""), "v6-any link-local"},
		{"::fffe:1.2.3.4 (in the /95)", testConn(t, "[::fffe:102:304]:1", "10.3.0.5:80", ""), "mapped-95 v6-any"},
	})
}

// TestSetUnkeyedRules covers every rule shape that has no key (the policy
// is a candidate for every connection) or that can never match (never a
// candidate), and dry-run policies (never candidates).
func TestSetUnkeyedRules(t *testing.T) {
	key := Match{Principals: []StringMatch{{Kind: Exact, Value: "td/ns/a/sa/x"}}}
	deny := func(p *Policy) *Policy { p.Action = Deny; return p }
	rules := func(name string, action Action, rs ...Rule) *Policy {
		return &Policy{Name: name, Namespace: "ns", Scope: Namespace, Action: action, Rules: rs}
	}
	ps := []*Policy{
		rules("no-rules", Allow),
		rules("rule-no-clauses", Allow, Rule{Clauses: []Clause{{Matches: []Match{key}}}}, Rule{}),
		rules("clause-no-matches", Allow, Rule{Clauses: []Clause{{}}}),
		rules("keyed-clause-chosen", Allow, Rule{Clauses: []Clause{{}, {Matches: []Match{key}}}}),
		allowOne("not-only", Match{NotPrincipals: key.Principals}),
		allowOne("presence", Match{Principals: []StringMatch{{Kind: Presence}}}),
		allowOne("allow-empty-match", Match{}),      // never holds
		deny(allowOne("deny-empty-match", Match{})), // always holds
		rules("allow-empty-and-key", Allow, Rule{Clauses: []Clause{{Matches: []Match{{}, key}}}}),
		deny(rules("deny-empty-and-key", Deny, Rule{Clauses: []Clause{{Matches: []Match{{}, key}}}})),
		{Name: "dry-run", Namespace: "ns", Scope: Namespace, Action: Deny, DryRun: true, Rules: []Rule{{}}},
		rules("keyed", Allow, Rule{Clauses: []Clause{{Matches: []Match{key}}}}),
	}
	checkCandidates(t, ps, []candidateCase{
		{"a/x", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/a/sa/x"),
			"deny-empty-match deny-empty-and-key rule-no-clauses clause-no-matches keyed-clause-chosen not-only presence allow-empty-and-key keyed"},
		{"b/x", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/b/sa/x"),
			"deny-empty-match deny-empty-and-key rule-no-clauses clause-no-matches not-only presence"},
	})
	s := newSetFrom(nil, ps, 0)
	if got, want := s.enforcedAllows(), 9; got != want {
		t.Errorf("enforcedAllows = %d, want %d (policies that are never candidates still apply)", got, want)
	}
}

// TestSetChoosesSelectiveClause: a rule "principal AND port" is keyed on
// the principal, so another principal on the same port is no candidate;
// a Match "namespace prefix AND /24" on the CIDR.
func TestSetChoosesSelectiveClause(t *testing.T) {
	ps := []*Policy{
		{Name: "p", Namespace: "ns", Scope: Namespace, Action: Allow, Rules: []Rule{
			{Clauses: []Clause{
				{Matches: []Match{{DestinationPorts: []uint16{8080}}}},
				{Matches: []Match{{Principals: []StringMatch{{Kind: Exact, Value: "td/ns/team-1/sa/web"}}}}},
			}},
			{Clauses: []Clause{{Matches: []Match{{
				Namespaces: []StringMatch{{Kind: Prefix, Value: "team-1"}},
				SourceIPs:  []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")},
			}}}}},
		}},
	}
	checkCandidates(t, ps, []candidateCase{
		{"other principal, port 8080, ns team-1x", testConn(t, "10.0.0.1:1", "10.0.0.2:8080", "spiffe://td/ns/team-1x/sa/web"), ""},
		{"from 192.168.1.7", testConn(t, "192.168.1.7:1", "10.0.0.2:80", "spiffe://td/ns/b/sa/web"), "p"},
		{"team-1 web", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/team-1/sa/web"), "p"},
	})
}

// TestSetMergeOrder: a policy posted under several keys a connection has
// is a candidate once, and candidates come in the Set's order.
func TestSetMergeOrder(t *testing.T) {
	var ps []*Policy
	for i := range 40 {
		m := Match{DestinationPorts: []uint16{80}}
		switch i % 3 {
		case 0:
			m = Match{ServiceAccounts: []ServiceAccountMatch{{Namespace: "a", ServiceAccount: "x"}, {Namespace: "a", ServiceAccount: "x"}}}
		case 1:
			m = Match{Namespaces: []StringMatch{{Kind: Exact, Value: "a"}, {Kind: Prefix, Value: "a"}, {Kind: Suffix, Value: "a"}}}
		}
		ps = append(ps, allowOne(fmt.Sprintf("p%02d", i), m))
	}
	var want []string
	for _, p := range ps {
		want = append(want, p.Name)
	}
	checkCandidates(t, ps, []candidateCase{
		{"all", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/a/sa/x"), strings.Join(want, " ")},
	})
}

// TestSetTooManyHits: a connection whose keys hit more postings than lookup
// holds falls back to every policy, with the same decision.
func TestSetTooManyHits(t *testing.T) {
	ns := "a-namespace-name-that-is-longer-than-the-hit-buffer-" + strings.Repeat("x", maxHits)
	var ps []*Policy
	for n := range len(ns) + 1 {
		ps = append(ps, allowOne(fmt.Sprintf("prefix%d", n), Match{
			Namespaces: []StringMatch{{Kind: Prefix, Value: ns[:n]}}}))
	}
	ps = append(ps, allowOne("last", Match{DestinationPorts: []uint16{80}}))
	checkCandidates(t, ps, []candidateCase{
		{"long namespace", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/"+ns+"/sa/x"), "ALL"},
		{"short namespace", testConn(t, "10.0.0.1:1", "10.0.0.2:80", "spiffe://td/ns/a-n/sa/x"), "prefix0 prefix1 prefix2 prefix3 last"},
	})
}

func TestNewSetEmpty(t *testing.T) {
	var s *Set
	if NewSetFrom(nil, nil) != nil || s.Len() != 0 || s.Policies() != nil || s.enforcedAllows() != 0 {
		t.Error("a nil Set is not empty")
	}
	if got := candidateNames(s, testConn(t, "10.0.0.1:1", "10.0.0.2:80", "")); got != "" {
		t.Errorf("nil Set candidates %q", got)
	}
	// Too small to index: every enforced policy is a candidate, and
	// enforced ALLOW policies are counted all the same.
	small := NewSetFrom(nil, []*Policy{allowOne("p", Match{}), {Name: "d", Namespace: "ns", Action: Allow, DryRun: true}})
	if got := candidateNames(small, testConn(t, "10.0.0.1:1", "10.0.0.2:80", "")); got != "ALL" || small.enforcedAllows() != 1 {
		t.Errorf("small Set: candidates %q, %d enforced ALLOW; want ALL, 1", got, small.enforcedAllows())
	}
	ps := []*Policy{allowOne("p", Match{})}
	if got := NewSetFrom(nil, ps).Policies(); !slices.Equal(got, ps) {
		t.Errorf("Policies() = %v, want %v", got, ps)
	}
	if diff := cmp.Diff(1, NewSetFrom(nil, ps).Len()); diff != "" {
		t.Error(diff)
	}
}
