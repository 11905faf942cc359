package envconfig

import (
	"strings"
	"testing"
)

// TestLocalhostAppTunnel: PROXY application tunnels go over loopback unless
// LOCALHOST_APP_TUNNEL says false, ztunnel's default (SPEC §0.3); a value
// that is not a boolean stops start-up naming the variable.
func TestLocalhostAppTunnel(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{
		{nil, true},
		{[]string{"LOCALHOST_APP_TUNNEL=true"}, true},
		{[]string{"LOCALHOST_APP_TUNNEL=false"}, false},
	} {
		c, err := Load(tc.env)
		if err != nil || c.LocalhostAppTunnel != tc.want {
			t.Errorf("Load(%q).LocalhostAppTunnel = %v, %v; want %v", tc.env, c.LocalhostAppTunnel, err, tc.want)
		}
	}
	if _, err := Load([]string{"LOCALHOST_APP_TUNNEL=maybe"}); err == nil || !strings.Contains(err.Error(), "LOCALHOST_APP_TUNNEL") {
		t.Errorf("Load(LOCALHOST_APP_TUNNEL=maybe) error = %v, want one naming the variable", err)
	}
}
