package envconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestXDSOnDemand: XDS_ON_DEMAND=true is accepted with the DNS proxy off,
// and refused with one line naming both when the DNS proxy is on, which
// it is by default (ztunnel's validate_config); false, or unset, is
// ztunnel's default.
func TestXDSOnDemand(t *testing.T) {
	const both = "invalid environment: XDS_ON_DEMAND: the DNS proxy (ISTIO_META_DNS_CAPTURE, on by default) does not support on-demand mode; set ISTIO_META_DNS_CAPTURE=false"
	for _, tc := range []struct {
		env      []string
		wantErr  string
		onDemand bool
	}{
		{nil, "", false},
		{[]string{"XDS_ON_DEMAND=false"}, "", false},
		{[]string{"XDS_ON_DEMAND=true", "ISTIO_META_DNS_CAPTURE=false"}, "", true},
		{[]string{"XDS_ON_DEMAND=true"}, both, false},
		{[]string{"XDS_ON_DEMAND=true", "ISTIO_META_DNS_CAPTURE=true"}, both, false},
		{[]string{"XDS_ON_DEMAND=sure", "ISTIO_META_DNS_CAPTURE=false"}, `invalid environment: XDS_ON_DEMAND: not a boolean: "sure"`, false},
	} {
		c, err := Load(tc.env)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("Load(%q) = %v, want no error", tc.env, err)
			} else if c.XDSOnDemand != tc.onDemand {
				t.Errorf("Load(%q).XDSOnDemand = %v, want %v", tc.env, c.XDSOnDemand, tc.onDemand)
			}
			continue
		}
		if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Load(%q) = %v, want the one line %q", tc.env, err, tc.wantErr)
		}
	}
}
