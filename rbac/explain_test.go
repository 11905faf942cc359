package rbac_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/gozt/gozt/rbac"
)

func explainFixture() (*fakeSource, []string) {
	other := rbac.Match{Principals: sms(exact("cluster.local/ns/other/sa/other"))}
	src := newFakeSource(
		&rbac.Policy{Name: "dry-deny", Namespace: "dst", Scope: rbac.Namespace, Action: rbac.Deny, DryRun: true,
			Rules: []rbac.Rule{rule()}},
		policy("istio-system", "deny-scanner", rbac.Global, rbac.Deny,
			rule(clause(rbac.Match{Principals: sms(exact("cluster.local/ns/scan/sa/bot"))}))),
		policy("dst", "allow-web", rbac.Namespace, rbac.Allow,
			rule(clause(other), clause(rbac.Match{DestinationPorts: ports(8080)})),
			rule(clause(rbac.Match{Principals: sms(exact(clientPrin))}))),
		policy("dst", "allow-ops", rbac.WorkloadSelector, rbac.Allow),
		&rbac.Policy{Name: "dry-allow", Namespace: "dst", Scope: rbac.WorkloadSelector, Action: rbac.Allow, DryRun: true,
			Rules: []rbac.Rule{rule(clause(rbac.Match{DestinationPorts: ports(8080)}))}},
	)
	return src, []string{"dst/allow-ops", "dst/allow-web", "dst/dry-allow"}
}

func TestExplain(t *testing.T) {
	src, refs := explainFixture()
	c := defaultConn(t)
	target := rbac.Target{Namespace: "dst", PolicyRefs: refs}
	got := rbac.Explain(src, target, c)

	want := rbac.Explanation{
		Src: srcDefault, Dst: dstDefault, Identity: clientID, Namespace: "dst",
		Allow: true, Reason: rbac.AllowedByPolicy, Summary: "allowed by policy dst/allow-web rule 1 (principals)",
		Policies: []rbac.PolicyResult{
			{Key: "dst/dry-deny", Action: "Deny", Scope: "Namespace", AppliesBy: "namespace", DryRun: true,
				Matched: true, Note: "dry run: would deny",
				Rules: []rbac.RuleResult{{Rule: 0, Matched: true, Clauses: []bool{}}}},
			{Key: "istio-system/deny-scanner", Action: "Deny", Scope: "Global", AppliesBy: "global",
				Rules: []rbac.RuleResult{{Rule: 0, Clauses: []bool{false}}}},
			{Key: "dst/dry-allow", Action: "Allow", Scope: "WorkloadSelector", AppliesBy: "reference", DryRun: true,
				Matched: true, Note: "dry run: matched, not enforced",
				Rules: []rbac.RuleResult{{Rule: 0, Matched: true, Match: rbac.FieldDestinationPorts, Clauses: []bool{true}}}},
			{Key: "dst/allow-web", Action: "Allow", Scope: "Namespace", AppliesBy: "namespace", Referenced: true,
				Matched: true, Decided: true,
				Rules: []rbac.RuleResult{
					{Rule: 0, Clauses: []bool{false, true}},
					{Rule: 1, Matched: true, Match: rbac.FieldPrincipals, Clauses: []bool{true}},
				}},
			{Key: "dst/allow-ops", Action: "Allow", Scope: "WorkloadSelector", AppliesBy: "reference",
				Note: "no rules: never matches", Rules: []rbac.RuleResult{}},
		},
	}
	opts := cmp.Options{
		cmpopts.IgnoreFields(rbac.PolicyResult{}, "Policy"),
		cmpopts.IgnoreFields(rbac.Explanation{}, "Decision"),
	}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("Explain (-want +got):\n%s", diff)
	}
	if d := rbac.Evaluate(src, target, c); got.Decision != d {
		t.Errorf("Explain.Decision = %v, want Evaluate's %v", got.Decision, d)
	}
	for _, pr := range got.Policies {
		if pr.Policy == nil || pr.Policy.Key() != pr.Key {
			t.Errorf("PolicyResult %s: Policy = %v", pr.Key, pr.Policy)
		}
	}
}

func TestExplainUnknownAndJSON(t *testing.T) {
	src, refs := explainFixture()
	refs = append(refs, "dst/missing", "dst/allow-ops", "dst/missing", "dst/gone")
	e := rbac.Explain(src, rbac.Target{Namespace: "dst", PolicyRefs: refs}, conn(t, "[2001:db8::1]:5", "[2001:db8::2]:8080", ""))
	if diff := cmp.Diff([]string{"dst/missing", "dst/gone"}, e.UnknownRefs); diff != "" {
		t.Errorf("UnknownRefs (-want +got):\n%s", diff)
	}
	if len(e.Policies) != 5 {
		t.Errorf("len(Policies) = %d, want 5 (each policy once)", len(e.Policies))
	}

	b, err := json.Marshal(e)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	var got struct {
		Src, Dst, Identity string
		Allow              bool
		Reason, Summary    string
		UnknownRefs        []string `json:"unknown_refs"`
		Policies           []struct {
			Key, Action, Scope string
			AppliesBy          string `json:"applies_by"`
			Rules              []struct {
				Rule    int
				Matched bool
				Match   string
				Clauses []bool
			}
		}
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", b, err)
	}
	if got.Reason != "DeniedUnknownPolicy" || got.Summary != "referenced policy dst/missing unknown" ||
		got.Allow || got.Identity != "" || got.Src != "[2001:db8::1]:5" {
		t.Errorf("JSON decision fields = %+v", got)
	}
	if p := got.Policies[2]; p.Key != "dst/dry-allow" || p.AppliesBy != "reference" || p.Rules[0].Match != "destination_ports" {
		t.Errorf("JSON policies[2] = %+v, from %s", p, b)
	}
}
