package certs

import (
	"crypto/x509"
	"encoding/asn1"
	"testing"
)

// TestAllowsUsage checks allowsUsage against crypto/x509's rule for
// VerifyOptions.KeyUsages, which x509svid.Verify does not apply.
func TestAllowsUsage(t *testing.T) {
	eku := func(usages ...x509.ExtKeyUsage) *x509.Certificate { return &x509.Certificate{ExtKeyUsage: usages} }
	var (
		none    = eku()
		anyEKU  = eku(x509.ExtKeyUsageAny)
		client  = eku(x509.ExtKeyUsageClientAuth)
		server  = eku(x509.ExtKeyUsageServerAuth)
		both    = eku(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
		unknown = &x509.Certificate{UnknownExtKeyUsage: []asn1.ObjectIdentifier{{1, 2, 3}}}
	)
	tests := []struct {
		name   string
		chains [][]*x509.Certificate
		want   bool
	}{
		{"no chains", nil, false},
		{"no EKU anywhere", [][]*x509.Certificate{{none, none}}, true},
		{"leaf both", [][]*x509.Certificate{{both, none}}, true},
		{"leaf client", [][]*x509.Certificate{{client, none}}, true},
		{"leaf server", [][]*x509.Certificate{{server, none}}, false},
		{"leaf any", [][]*x509.Certificate{{anyEKU, none}}, true},
		{"leaf unknown only", [][]*x509.Certificate{{unknown, none}}, false},
		{"intermediate server", [][]*x509.Certificate{{both, server, none}}, false},
		{"intermediate any", [][]*x509.Certificate{{both, anyEKU, none}}, true},
		{"root server", [][]*x509.Certificate{{both, server}}, false},
		{"second chain ok", [][]*x509.Certificate{{both, server}, {both, none}}, true},
	}
	for _, tt := range tests {
		if got := allowsUsage(tt.chains, x509.ExtKeyUsageClientAuth); got != tt.want {
			t.Errorf("%s: allowsUsage(client auth) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
