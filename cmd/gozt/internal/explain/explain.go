// Package explain answers "why was this connection allowed or denied?" for
// L4 authorization (issue 3, part 5): the admin endpoint
// GET /debug/authz?src=IP[:port]&identity=SPIFFE&dst=IP:port ([Handler]),
// against the live state, and `gozt explain --config-dump FILE ...` ([Run]),
// offline against a saved /config_dump of gozt or of a real ztunnel.
//
// Both find the destination workload by IP, evaluate the connection with
// rbac.Explain (the same evaluator, and so the same decision, as the inbound
// proxy's rbac.Evaluate) and report, as JSON, the workload, every applicable
// policy in evaluation order with the outcome of each rule and clause, and
// the decision with its reason.
//
// Only cmd/gozt imports this package.
package explain

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// ErrNoWorkload is wrapped by Explain's error when no workload has the
// destination IP; an HTTP handler answers it with 404.
var ErrNoWorkload = errors.New("no workload has the destination address")

// Result is the JSON answer to a Query.
type Result struct {
	Src      string `json:"src"`
	Identity string `json:"identity"` // spiffe://…, or "" for plaintext
	Dst      string `json:"dst"`
	Network  string `json:"network"`

	// Workload is the destination workload.
	Workload Workload `json:"workload"`
	// Decision is what the inbound proxy would decide.
	Decision Decision `json:"decision"`
	// Policies lists every applicable policy once, in evaluation order
	// (SPEC §4.3: dry-run DENY, DENY, dry-run ALLOW, ALLOW), each with the
	// outcome of every rule.
	Policies []Policy `json:"policies"`
	// UnknownRefs are policies the workload references that the state does
	// not hold; any of them denies (gozt fails closed, TESTPLAN S6).
	UnknownRefs []string `json:"unknown_refs,omitempty"`
}

// Workload identifies the destination workload.
type Workload struct {
	UID       string `json:"uid"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Identity  string `json:"identity"`
	// AuthorizationPolicies are the policy keys the workload references.
	AuthorizationPolicies []string `json:"authorization_policies"`
}

// Decision is the outcome.
type Decision struct {
	Allow bool `json:"allow"`
	// Reason is the rbac.Reason name, for example "DeniedByPolicy".
	Reason string `json:"reason"`
	// Summary is the reason string the access log carries, for example
	// "denied by policy ns/name rule 0 (principals)".
	Summary string `json:"summary"`
	// Policy ("namespace/name") and Rule (index in its rules) name the
	// deciding policy when one decided.
	Policy string `json:"policy,omitempty"`
	Rule   *int   `json:"rule,omitempty"`
	// Match lists the match fields that held in the deciding rule,
	// comma-separated (rbac.Fields); empty when the rule held
	// unconditionally.
	Match string `json:"match,omitempty"`
	// Missing is the unknown referenced policy that denied.
	Missing string `json:"missing,omitempty"`
}

// Policy is how one applicable policy fared: rbac.PolicyResult in a form
// that decodes as well as it encodes.
type Policy struct {
	Key    string `json:"key"`
	Action string `json:"action"`
	Scope  string `json:"scope"`
	// AppliesBy is "namespace", "global" or "reference".
	AppliesBy string `json:"applies_by"`
	// Referenced reports whether the workload also references a policy that
	// applies by scope.
	Referenced bool `json:"referenced,omitempty"`
	DryRun     bool `json:"dry_run,omitempty"`
	// Matched reports whether any rule matched.
	Matched bool `json:"matched"`
	// Decided reports whether this policy made the decision.
	Decided bool   `json:"decided,omitempty"`
	Note    string `json:"note,omitempty"`
	Rules   []Rule `json:"rules"`
}

// Rule is how one rule fared.
type Rule struct {
	Rule    int  `json:"rule"`
	Matched bool `json:"matched"`
	// Match lists the fields that satisfied the clauses when Matched.
	Match string `json:"match,omitempty"`
	// Clauses reports, per clause, whether it was satisfied.
	Clauses []bool `json:"clauses"`
}

func policiesOf(prs []rbac.PolicyResult) []Policy {
	out := make([]Policy, 0, len(prs))
	for _, pr := range prs {
		p := Policy{
			Key: pr.Key, Action: pr.Action, Scope: pr.Scope, AppliesBy: pr.AppliesBy,
			Referenced: pr.Referenced, DryRun: pr.DryRun, Matched: pr.Matched, Decided: pr.Decided,
			Note: pr.Note, Rules: make([]Rule, 0, len(pr.Rules)),
		}
		for _, rr := range pr.Rules {
			p.Rules = append(p.Rules, Rule{Rule: rr.Rule, Matched: rr.Matched, Match: rr.Match.String(),
				Clauses: append([]bool{}, rr.Clauses...)})
		}
		out = append(out, p)
	}
	return out
}

// Explain evaluates q against snap. It fails, wrapping ErrNoWorkload, when no
// workload has q.Dst's IP on q.Network.
func Explain(snap *state.Snapshot, q Query) (Result, error) {
	ip := q.Dst.Addr().Unmap()
	w := snap.WorkloadByIP(q.Network, ip)
	if w == nil {
		return Result{}, noWorkload(snap, q.Network, ip)
	}
	e := rbac.Explain(snap,
		rbac.Target{Namespace: w.Namespace, PolicyRefs: w.AuthorizationPolicies},
		rbac.Conn{Src: q.Src, Dst: q.Dst, Identity: q.Identity})
	r := Result{
		Src:      e.Src,
		Identity: e.Identity,
		Dst:      e.Dst,
		Network:  q.Network,
		Workload: Workload{
			UID:                   w.UID,
			Name:                  w.Name,
			Namespace:             w.Namespace,
			Identity:              w.Identity().String(),
			AuthorizationPolicies: append([]string{}, w.AuthorizationPolicies...),
		},
		Decision:    decisionOf(e.Decision),
		Policies:    policiesOf(e.Policies),
		UnknownRefs: e.UnknownRefs,
	}
	return r, nil
}

func decisionOf(d rbac.Decision) Decision {
	out := Decision{Allow: d.Allow, Reason: d.Reason.String(), Summary: d.String(), Match: d.Match.String(), Missing: d.Missing}
	if d.Policy != nil {
		out.Policy = d.Policy.Key()
		rule := d.Rule
		out.Rule = &rule
	}
	return out
}

// noWorkload builds the error for an address no workload has, with a hint
// when the address is a service VIP or belongs to a workload on another
// network (or one in host network mode, which is not indexed by IP).
func noWorkload(snap *state.Snapshot, network string, ip netip.Addr) error {
	err := fmt.Errorf("%w: %s on network %q", ErrNoWorkload, ip, network)
	if svc := snap.ServiceByVIP(network, ip, ""); svc != nil {
		return fmt.Errorf("%w; it is a VIP of service %s: give a pod IP and its target port", err, svc.Key())
	}
	var hints []string
	for _, w := range snap.Workloads() {
		if !w.HasAddress(ip) {
			continue
		}
		switch {
		case w.NetworkMode == state.NetworkHost:
			hints = append(hints, fmt.Sprintf("%s uses the host network", w.UID))
		case w.Network != network:
			hints = append(hints, fmt.Sprintf("%s is on network %q", w.UID, w.Network))
		}
	}
	if len(hints) > 0 {
		return fmt.Errorf("%w; %s", err, strings.Join(hints, "; "))
	}
	return err
}

// WriteText writes r as a short human summary (`gozt explain --format text`).
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	verdict := "DENY"
	if r.Decision.Allow {
		verdict = "ALLOW"
	}
	id := r.Identity
	if id == "" {
		id = "no identity"
	}
	fmt.Fprintf(&b, "%s %s (%s) -> %s\n", verdict, r.Src, id, r.Dst)
	fmt.Fprintf(&b, "workload: %s (%s/%s, %s)\n", r.Workload.UID, r.Workload.Namespace, r.Workload.Name, r.Workload.Identity)
	fmt.Fprintf(&b, "decision: %s\n", r.Decision.Summary)
	if len(r.Policies) == 0 {
		b.WriteString("policies: none apply\n")
	} else {
		b.WriteString("policies, in evaluation order:\n")
	}
	for i := range r.Policies {
		writePolicyText(&b, &r.Policies[i])
	}
	if len(r.UnknownRefs) > 0 {
		fmt.Fprintf(&b, "unknown referenced policies (deny): %s\n", strings.Join(r.UnknownRefs, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writePolicyText(b *strings.Builder, p *Policy) {
	outcome := "no match"
	if p.Matched {
		outcome = "matched"
	}
	fmt.Fprintf(b, "  %-5s %s [%s", strings.ToUpper(p.Action), p.Key, p.AppliesBy)
	if p.Referenced {
		b.WriteString(", referenced")
	}
	if p.DryRun {
		b.WriteString(", dry run")
	}
	fmt.Fprintf(b, "]: %s", outcome)
	if p.Decided {
		b.WriteString(" <- decided")
	}
	if p.Note != "" {
		fmt.Fprintf(b, " (%s)", p.Note)
	}
	b.WriteByte('\n')
	for _, rr := range p.Rules {
		fmt.Fprintf(b, "    rule %d: ", rr.Rule)
		switch {
		case rr.Matched && rr.Match == "":
			b.WriteString("matched (unconditional)")
		case rr.Matched:
			fmt.Fprintf(b, "matched (%s)", rr.Match)
		default:
			b.WriteString("no match")
		}
		if len(rr.Clauses) > 0 {
			fmt.Fprintf(b, ", clauses %v", rr.Clauses)
		}
		b.WriteByte('\n')
	}
}
