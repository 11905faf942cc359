package rbac

import (
	"net/netip"

	"github.com/gozt/gozt/certs/identity"
)

// Conn is what authorization sees of one inbound connection (SPEC §4.3,
// "The connection evaluated"). It deliberately has no field for anything the
// client sends inside its tunnel (headers, baggage, Forwarded): those never
// change a decision (TESTPLAN S8).
type Conn struct {
	// Src is the HBONE TCP peer, or the plaintext client.
	Src netip.AddrPort
	// Dst is the local pod IP and the resolved target port (after
	// service-port translation); never the tunnel port 15008.
	Dst netip.AddrPort
	// Identity is the peer's certificate identity; the zero value means no
	// identity (plaintext).
	Identity identity.Identity
}

// Source gives the policies that may apply to a destination workload.
// state's snapshot implements it.
//
// The evaluator only reads what Source returns and keeps nothing after
// Evaluate returns. Every policy it returns must have passed Validate and must
// not change afterwards. NamespacePolicies and GlobalPolicies must list every
// policy of their scope, each once: Evaluate relies on that to skip a
// referenced policy that already applies by scope.
type Source interface {
	// NamespacePolicies returns the Namespace-scoped policies whose
	// Namespace is ns.
	NamespacePolicies(ns string) []*Policy
	// GlobalPolicies returns the Global-scoped policies.
	GlobalPolicies() []*Policy
	// Policy returns the policy with key "namespace/name", or nil if unknown.
	Policy(key string) *Policy
}

// Target describes the destination workload.
type Target struct {
	// Namespace is the workload's namespace.
	Namespace string
	// PolicyRefs are the workload's authorization_policies keys
	// ("namespace/name"); nil when it references none.
	PolicyRefs []string
}

// Evaluate decides one connection (SPEC §4.2–4.3, with the differences listed
// in the package documentation). It does not allocate.
//
// Order: every enforced DENY policy (namespace, then global, then referenced,
// each in the order Source gives them) — the first that matches denies; then,
// if a referenced key is unknown, deny; then every enforced ALLOW policy in the
// same order — the first that matches allows; if there was at least one, deny;
// otherwise allow. Dry-run policies are skipped: they never decide.
//
// When src is a SetSource, the namespace and global lists are searched
// through their Sets' indexes, with the same result.
func Evaluate(src Source, t Target, c Conn) Decision {
	in := newInput(&c)
	if ss, ok := src.(SetSource); ok {
		return evaluateSets(ss, &t, &in)
	}
	d, missing := evalDeny(src, &t, &in)
	if d.Reason != 0 {
		return d
	}
	if missing != "" {
		// Deliberate difference (1): ztunnel skips an unknown reference.
		return Decision{Reason: DeniedUnknownPolicy, Rule: -1, Missing: missing}
	}
	return evalAllow(src, &t, &in)
}

// evalDeny runs the enforced DENY phase. It returns a decision with a
// non-zero Reason when a DENY matched, and the first referenced key that is
// unknown, or "".
func evalDeny(src Source, t *Target, in *input) (d Decision, missing string) {
	for _, p := range src.NamespacePolicies(t.Namespace) {
		if d, ok := denies(p, in); ok {
			return d, ""
		}
	}
	for _, p := range src.GlobalPolicies() {
		if d, ok := denies(p, in); ok {
			return d, ""
		}
	}
	return evalRefsDeny(src, t, in)
}

// evalRefsDeny runs the enforced DENY phase over the referenced policies
// that do not apply by scope, like evalDeny.
func evalRefsDeny(src Source, t *Target, in *input) (d Decision, missing string) {
	for _, key := range t.PolicyRefs {
		p := src.Policy(key)
		if p == nil {
			if missing == "" {
				missing = key
			}
			continue
		}
		if appliesByScope(p, t.Namespace) {
			continue
		}
		if d, ok := denies(p, in); ok {
			return d, ""
		}
	}
	return Decision{}, missing
}

// denies reports whether p is an enforced DENY policy that matches, and if so
// the decision. Any action other than Allow is treated as Deny, so a policy
// with a corrupt action fails closed.
func denies(p *Policy, in *input) (Decision, bool) {
	if p.DryRun || p.Action == Allow {
		return Decision{}, false
	}
	rule, f := p.match(in)
	if rule < 0 {
		return Decision{}, false
	}
	return Decision{Reason: DeniedByPolicy, Policy: p, Rule: rule, Match: f}, true
}

// evalAllow runs the enforced ALLOW phase and makes the final decision.
func evalAllow(src Source, t *Target, in *input) Decision {
	var n int // enforced ALLOW policies seen
	for _, p := range src.NamespacePolicies(t.Namespace) {
		if d, ok := allows(p, in, &n); ok {
			return d
		}
	}
	for _, p := range src.GlobalPolicies() {
		if d, ok := allows(p, in, &n); ok {
			return d
		}
	}
	return evalRefsAllow(src, t, in, n)
}

// evalRefsAllow runs the enforced ALLOW phase over the referenced policies
// that do not apply by scope and makes the final decision; n is the number
// of enforced ALLOW policies that applied before.
func evalRefsAllow(src Source, t *Target, in *input, n int) Decision {
	for _, key := range t.PolicyRefs {
		p := src.Policy(key)
		if p == nil || appliesByScope(p, t.Namespace) {
			continue
		}
		if d, ok := allows(p, in, &n); ok {
			return d
		}
	}
	if n > 0 {
		return Decision{Reason: DeniedNoAllowMatched, Rule: -1}
	}
	return Decision{Allow: true, Reason: AllowedNoPolicies, Rule: -1}
}

// evaluateSets is Evaluate for a SetSource: the same phases in the same
// order, but each Set yields only its candidates, in order. A policy that
// is not a candidate cannot match, so the first candidate that matches is
// the first policy that matches; and the count of enforced ALLOW policies
// comes from the Sets, not from the candidates.
func evaluateSets(src SetSource, t *Target, in *input) Decision {
	sets := [2]*Set{src.NamespaceSet(t.Namespace), src.GlobalSet()}
	var hs [2]hits
	for i, s := range sets {
		s.lookup(in, &hs[i])
	}
	for i, s := range sets {
		if d, ok := s.firstMatch(in, &hs[i], denyPhase); ok {
			return d
		}
	}
	d, missing := evalRefsDeny(src, t, in)
	if d.Reason != 0 {
		return d
	}
	if missing != "" {
		return Decision{Reason: DeniedUnknownPolicy, Rule: -1, Missing: missing}
	}
	n := 0
	for i, s := range sets {
		if d, ok := s.firstMatch(in, &hs[i], allowPhase); ok {
			return d
		}
		n += s.enforcedAllows()
	}
	return evalRefsAllow(src, t, in, n)
}

// allows reports whether p is an enforced ALLOW policy that matches, and if
// so the decision. It counts enforced ALLOW policies in *n.
func allows(p *Policy, in *input, n *int) (Decision, bool) {
	if p.DryRun || p.Action != Allow {
		return Decision{}, false
	}
	*n++
	rule, f := p.match(in)
	if rule < 0 {
		return Decision{}, false
	}
	return Decision{Allow: true, Reason: AllowedByPolicy, Policy: p, Rule: rule, Match: f}, true
}

// appliesByScope reports whether p already applies to a workload in namespace
// ns through its scope, so that a reference to it must not evaluate it again.
func appliesByScope(p *Policy, ns string) bool {
	return p.Scope == Global || p.Scope == Namespace && p.Namespace == ns
}
