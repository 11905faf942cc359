package rbac

import (
	"net/netip"
)

// Action is what a policy does when it matches (SPEC §4.1, enum Action).
type Action uint8

const (
	// Allow admits a connection that matches; when any enforced ALLOW
	// policy applies, connections matching none of them are denied.
	Allow Action = 0
	// Deny rejects a connection that matches.
	Deny Action = 1
)

func (a Action) String() string {
	switch a {
	case Allow:
		return "Allow"
	case Deny:
		return "Deny"
	}
	return "Unknown"
}

// Scope says which workloads a policy applies to (SPEC §4.2, enum Scope).
type Scope uint8

const (
	// Global policies apply to every workload, whatever their namespace field.
	Global Scope = 0
	// Namespace policies apply to every workload in the policy's namespace.
	Namespace Scope = 1
	// WorkloadSelector policies apply only to workloads that name them in
	// their authorization_policies list.
	WorkloadSelector Scope = 2
)

func (s Scope) String() string {
	switch s {
	case Global:
		return "Global"
	case Namespace:
		return "Namespace"
	case WorkloadSelector:
		return "WorkloadSelector"
	}
	return "Unknown"
}

// Policy is one istio.security.Authorization resource.
//
// Nesting follows ztunnel's names: a policy has Rules (OR), a rule has
// Clauses (AND), a clause has Matches (OR). Istio's Go package calls the same
// levels groups/rules/matches with the same field numbers.
type Policy struct {
	Name      string
	Namespace string
	Scope     Scope
	Action    Action
	DryRun    bool
	Rules     []Rule
}

// Key returns the policy's resource name, "namespace/name", which is what
// workloads reference in their authorization_policies list.
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Rule holds clauses that must all be satisfied for the rule to match.
type Rule struct {
	Clauses []Clause
}

// Clause is satisfied when any of its matches holds.
type Clause struct {
	Matches []Match
}

// Match holds when every non-empty field holds. A positive list holds when
// any entry matches; a not_ list holds when no entry matches.
type Match struct {
	Namespaces          []StringMatch
	NotNamespaces       []StringMatch
	Principals          []StringMatch
	NotPrincipals       []StringMatch
	SourceIPs           []netip.Prefix
	NotSourceIPs        []netip.Prefix
	DestinationIPs      []netip.Prefix
	NotDestinationIPs   []netip.Prefix
	DestinationPorts    []uint16
	NotDestinationPorts []uint16
	ServiceAccounts     []ServiceAccountMatch
	NotServiceAccounts  []ServiceAccountMatch
}

// MatchKind is the kind of a StringMatch.
type MatchKind uint8

const (
	// Exact compares the whole string.
	Exact MatchKind = iota
	// Prefix holds when the value starts with StringMatch.Value.
	Prefix
	// Suffix holds when the value ends with StringMatch.Value.
	Suffix
	// Presence holds when the value is non-empty.
	Presence
)

func (k MatchKind) String() string {
	switch k {
	case Exact:
		return "Exact"
	case Prefix:
		return "Prefix"
	case Suffix:
		return "Suffix"
	case Presence:
		return "Presence"
	}
	return "Unknown"
}

// StringMatch is a literal string comparison; it is never a regular
// expression (TESTPLAN S2).
type StringMatch struct {
	Kind  MatchKind
	Value string // unused for Presence
}

// ServiceAccountMatch matches an identity's namespace and service account
// exactly; the trust domain is ignored.
type ServiceAccountMatch struct {
	Namespace      string
	ServiceAccount string
}
