package rbac

import (
	"strconv"
	"strings"
)

// Decision is the outcome of Evaluate for one connection.
type Decision struct {
	// Allow reports whether the connection may proceed.
	Allow bool
	// Reason says why. The zero Reason means no decision was made (a zero
	// Decision denies).
	Reason Reason
	// Policy is the deciding policy for AllowedByPolicy and DeniedByPolicy,
	// or nil.
	Policy *Policy
	// Rule is the index in Policy.Rules of the rule that matched, or -1.
	Rule int
	// Match is the set of fields of the Matches that satisfied the rule's
	// clauses. It is zero when the rule holds unconditionally (no clauses,
	// or only clauses without matches) or when no policy decided.
	Match Fields
	// Missing is the unknown referenced policy key for DeniedUnknownPolicy,
	// or "".
	Missing string
}

// String describes d for logs and access logs, for example
// "denied by policy ns/name rule 0 (principals)",
// "no ALLOW policy matched" or "referenced policy ns/p1 unknown".
func (d Decision) String() string {
	switch d.Reason {
	case AllowedNoPolicies:
		return "allowed: no ALLOW policy applies"
	case AllowedByPolicy:
		return "allowed by " + d.policyRule()
	case DeniedByPolicy:
		return "denied by " + d.policyRule()
	case DeniedNoAllowMatched:
		return "no ALLOW policy matched"
	case DeniedUnknownPolicy:
		return "referenced policy " + d.Missing + " unknown"
	}
	return "no decision"
}

func (d Decision) policyRule() string {
	var b strings.Builder
	b.WriteString("policy ")
	if d.Policy != nil {
		b.WriteString(d.Policy.Key())
	}
	b.WriteString(" rule ")
	b.WriteString(strconv.Itoa(d.Rule))
	b.WriteString(" (")
	if d.Match == 0 {
		b.WriteString("unconditional")
	} else {
		b.WriteString(d.Match.String())
	}
	b.WriteString(")")
	return b.String()
}

// Reason says why a connection was allowed or denied.
type Reason uint8

const (
	// AllowedNoPolicies: no enforced DENY matched and no enforced ALLOW
	// policy applies.
	AllowedNoPolicies Reason = iota + 1
	// AllowedByPolicy: an enforced ALLOW policy matched.
	AllowedByPolicy
	// DeniedByPolicy: an enforced DENY policy matched.
	DeniedByPolicy
	// DeniedNoAllowMatched: enforced ALLOW policies apply, but none matched
	// (ztunnel: "allow policies exist, but none allowed").
	DeniedNoAllowMatched
	// DeniedUnknownPolicy: the workload references a policy that is not
	// known. ztunnel skips such a reference; gozt fails closed (TESTPLAN S6).
	DeniedUnknownPolicy
)

var reasonNames = [...]string{
	AllowedNoPolicies:    "AllowedNoPolicies",
	AllowedByPolicy:      "AllowedByPolicy",
	DeniedByPolicy:       "DeniedByPolicy",
	DeniedNoAllowMatched: "DeniedNoAllowMatched",
	DeniedUnknownPolicy:  "DeniedUnknownPolicy",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// MarshalText encodes r as its name, for JSON.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Fields is a set of Match fields. A Decision uses it to say which
// attributes decided; Match.Fields lists the fields a Match uses.
type Fields uint16

// The Match fields, named after the proto fields (SPEC §4.1), and one
// pseudo-field for an empty Match in a DENY policy.
const (
	FieldNamespaces Fields = 1 << iota
	FieldNotNamespaces
	FieldPrincipals
	FieldNotPrincipals
	FieldSourceIPs
	FieldNotSourceIPs
	FieldDestinationIPs
	FieldNotDestinationIPs
	FieldDestinationPorts
	FieldNotDestinationPorts
	FieldServiceAccounts
	FieldNotServiceAccounts
	// FieldEmptyMatch marks a Match with every field empty that held
	// because it is in a DENY policy: what istiod sends for L7-only
	// attributes (see the package documentation).
	FieldEmptyMatch
)

var fieldNames = [...]string{
	"namespaces",
	"not_namespaces",
	"principals",
	"not_principals",
	"source_ips",
	"not_source_ips",
	"destination_ips",
	"not_destination_ips",
	"destination_ports",
	"not_destination_ports",
	"service_accounts",
	"not_service_accounts",
	"empty_match",
}

// String returns the names of the fields in f, comma-separated in proto
// order, for example "principals,destination_ports"; "" for the empty set.
func (f Fields) String() string {
	var b strings.Builder
	for i, name := range fieldNames {
		if f&(1<<i) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name)
	}
	if rest := f &^ (1<<len(fieldNames) - 1); rest != 0 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString("Fields(" + strconv.Itoa(int(rest)) + ")")
	}
	return b.String()
}

// MarshalText encodes f as String does, for JSON.
func (f Fields) MarshalText() ([]byte, error) { return []byte(f.String()), nil }
