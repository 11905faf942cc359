package rbac

// Explanation is Evaluate's decision with its working: every policy that
// applies to the connection, in evaluation order, and the outcome of each of
// its rules. It serves /debug/authz and `gozt explain`, so it is built for
// JSON and allocates freely.
type Explanation struct {
	Src       string `json:"src"`
	Dst       string `json:"dst"`
	Identity  string `json:"identity"`  // spiffe://… or "" without identity
	Namespace string `json:"namespace"` // the destination workload's

	Allow   bool   `json:"allow"`
	Reason  Reason `json:"reason"`
	Summary string `json:"summary"` // Decision.String()

	// Policies lists each applicable policy once, in the order of SPEC
	// §4.3: dry-run DENY, DENY, dry-run ALLOW, ALLOW; within each group
	// namespace-scoped, then global, then referenced policies.
	Policies []PolicyResult `json:"policies"`
	// UnknownRefs are the referenced keys that are not known, or nil.
	// Any of them denies the connection unless a DENY matched first.
	UnknownRefs []string `json:"unknown_refs,omitempty"`

	// Decision is what Evaluate returns for the same input.
	Decision Decision `json:"-"`
}

// PolicyResult is how one applicable policy fared.
type PolicyResult struct {
	Key    string `json:"key"`
	Action string `json:"action"`
	Scope  string `json:"scope"`
	// AppliesBy is how the policy applies: "namespace", "global" or
	// "reference".
	AppliesBy string `json:"applies_by"`
	// Referenced reports whether the workload also names the policy in its
	// authorization_policies, when it applies by scope already.
	Referenced bool `json:"referenced,omitempty"`
	DryRun     bool `json:"dry_run,omitempty"`
	// Matched reports whether any rule matched.
	Matched bool `json:"matched"`
	// Decided reports whether this policy made the decision.
	Decided bool   `json:"decided,omitempty"`
	Note    string `json:"note,omitempty"`
	// Rules has one entry per rule of the policy, in order.
	Rules []RuleResult `json:"rules"`

	// Policy is the policy itself.
	Policy *Policy `json:"-"`
}

// RuleResult is how one rule fared; every clause is evaluated (no
// short-circuit) so that all failing clauses show.
type RuleResult struct {
	Rule    int  `json:"rule"`
	Matched bool `json:"matched"`
	// Match is the set of fields that satisfied the clauses when Matched;
	// empty for an unconditional match.
	Match Fields `json:"match,omitempty"`
	// Clauses reports, per clause, whether it was satisfied.
	Clauses []bool `json:"clauses"`
}

// Ways a policy applies, for PolicyResult.AppliesBy.
const (
	appliesByNamespace = "namespace"
	appliesByGlobal    = "global"
	appliesByReference = "reference"
)

// Explain evaluates like Evaluate and records every applicable policy and
// rule outcome. Its Decision is Evaluate's, through src's Sets when src is a
// SetSource; the working walks the lists themselves (NamespacePolicies,
// GlobalPolicies), every policy and not only the index's candidates, so it
// also shows why a policy that was no candidate did not match.
func Explain(src Source, t Target, c Conn) Explanation {
	d := Evaluate(src, t, c)
	e := Explanation{
		Src:       c.Src.String(),
		Dst:       c.Dst.String(),
		Identity:  c.Identity.String(),
		Namespace: t.Namespace,
		Allow:     d.Allow,
		Reason:    d.Reason,
		Summary:   d.String(),
		Decision:  d,
		Policies:  []PolicyResult{},
	}
	applicable, unknown := collect(src, t)
	e.UnknownRefs = unknown
	in := newInput(&c)
	for _, group := range []struct {
		action Action
		dryRun bool
	}{{Deny, true}, {Deny, false}, {Allow, true}, {Allow, false}} {
		for _, pr := range applicable {
			p := pr.Policy
			if p.DryRun != group.dryRun || (p.Action == Allow) != (group.action == Allow) {
				continue
			}
			explainPolicy(&pr, &in)
			pr.Decided = p == d.Policy
			e.Policies = append(e.Policies, pr)
		}
	}
	return e
}

// collect lists the applicable policies once each, in the order Evaluate
// visits them, and the unknown referenced keys.
func collect(src Source, t Target) (applicable []PolicyResult, unknown []string) {
	index := make(map[*Policy]int)
	add := func(p *Policy, by string) {
		if i, ok := index[p]; ok {
			if by == appliesByReference {
				applicable[i].Referenced = true
			}
			return
		}
		index[p] = len(applicable)
		applicable = append(applicable, PolicyResult{
			Key:       p.Key(),
			Action:    p.Action.String(),
			Scope:     p.Scope.String(),
			AppliesBy: by,
			DryRun:    p.DryRun,
			Policy:    p,
		})
	}
	for _, p := range src.NamespacePolicies(t.Namespace) {
		add(p, appliesByNamespace)
	}
	for _, p := range src.GlobalPolicies() {
		add(p, appliesByGlobal)
	}
	seen := make(map[string]bool)
	for _, key := range t.PolicyRefs {
		if p := src.Policy(key); p != nil {
			add(p, appliesByReference)
		} else if !seen[key] {
			seen[key] = true
			unknown = append(unknown, key)
		}
	}
	return applicable, unknown
}

// explainPolicy fills in the rule outcomes of pr.Policy.
func explainPolicy(pr *PolicyResult, in *input) {
	p := pr.Policy
	deny := p.Action != Allow
	pr.Rules = make([]RuleResult, len(p.Rules))
	for ri := range p.Rules {
		r := &p.Rules[ri]
		rr := RuleResult{Rule: ri, Matched: true, Clauses: make([]bool, len(r.Clauses))}
		for ci := range r.Clauses {
			f, ok := r.Clauses[ci].match(in, deny)
			rr.Clauses[ci] = ok
			rr.Matched = rr.Matched && ok
			rr.Match |= f
		}
		if !rr.Matched {
			rr.Match = 0
		}
		pr.Matched = pr.Matched || rr.Matched
		pr.Rules[ri] = rr
	}
	switch {
	case len(p.Rules) == 0:
		pr.Note = "no rules: never matches"
	case pr.DryRun && pr.Matched && deny:
		pr.Note = "dry run: would deny"
	case pr.DryRun && pr.Matched:
		pr.Note = "dry run: matched, not enforced"
	}
}
