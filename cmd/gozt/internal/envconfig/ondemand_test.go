package envconfig

import (
	"errors"
	"strings"
	"testing"
)

// TestXDSOnDemand: XDS_ON_DEMAND=true stops start-up with one line naming
// it, as gozt's xDS client has no on-demand subscriptions (SPEC §5.3);
// false, or unset, is ztunnel's default and starts.
func TestXDSOnDemand(t *testing.T) {
	for _, tc := range []struct {
		env     []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"XDS_ON_DEMAND=false"}, ""},
		{[]string{"XDS_ON_DEMAND=true"}, "invalid environment: XDS_ON_DEMAND: on-demand xDS is not supported yet"},
		{[]string{"XDS_ON_DEMAND=sure"}, `invalid environment: XDS_ON_DEMAND: not a boolean: "sure"`},
	} {
		_, err := Load(tc.env)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("Load(%q) = %v, want no error", tc.env, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Load(%q) = %v, want the one line %q", tc.env, err, tc.wantErr)
		}
	}
}
