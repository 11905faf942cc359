package rbac_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/gozt/gozt/rbac"
)

func TestValidate(t *testing.T) {
	withMatch := func(m rbac.Match) *rbac.Policy {
		return policy("ns", "p", rbac.WorkloadSelector, rbac.Deny, rule(), rule(clause(rbac.Match{}, m)))
	}
	tests := []struct {
		name    string
		p       *rbac.Policy
		wantErr string // "" for valid
	}{
		{"valid/empty-policy", policy("ns", "p", rbac.Namespace, rbac.Allow), ""},
		{"valid/empty-everything", policy("ns", "p", rbac.Global, rbac.Deny, rule(), rule(clause()), rule(clause(rbac.Match{}))), ""},
		{"valid/realistic", withMatch(rbac.Match{
			Namespaces: sms(exact(""), prefix("a"), suffix("b")), NotPrincipals: sms(presence()),
			SourceIPs: cidrs("10.0.0.7/8", "::/0", "::ffff:10.0.0.0/104"), DestinationPorts: ports(0, 15008),
			ServiceAccounts: sas(sa("", "")),
		}), ""},
		{"nil", nil, "rbac: nil policy"},
		{"no-name", policy("ns", "", rbac.Namespace, rbac.Allow), `rbac: policy "ns/": empty name`},
		{"no-namespace", policy("", "p", rbac.Namespace, rbac.Allow), `rbac: policy "/p": empty namespace`},
		{"slash-namespace", policy("a/b", "p", rbac.Namespace, rbac.Allow), `namespace contains '/'`},
		{"bad-scope", policy("ns", "p", rbac.Scope(3), rbac.Allow), `rbac: policy "ns/p": unknown scope 3`},
		{"bad-action", policy("ns", "p", rbac.Namespace, rbac.Action(2)), `rbac: policy "ns/p": unknown action 2`},
		{"bad-kind", withMatch(rbac.Match{NotNamespaces: sms(exact("a"), rbac.StringMatch{Kind: 9})}),
			`rbac: policy "ns/p": rule 1 clause 0 match 1: not_namespaces[1]: unknown match kind 9`},
		{"bad-principal-kind", withMatch(rbac.Match{Principals: sms(rbac.StringMatch{Kind: 4})}), `principals[0]: unknown match kind 4`},
		{"presence-with-value", withMatch(rbac.Match{Principals: sms(rbac.StringMatch{Kind: rbac.Presence, Value: "x"})}),
			`principals[0]: presence match has value "x"`},
		{"zero-prefix", withMatch(rbac.Match{NotDestinationIPs: []netip.Prefix{{}}}),
			`rule 1 clause 0 match 1: not_destination_ips[0]: invalid CIDR invalid Prefix`},
		{"bad-bits", withMatch(rbac.Match{SourceIPs: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33)}}),
			`source_ips[0]: invalid CIDR`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}
