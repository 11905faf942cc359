package envconfig

import (
	"strings"
	"testing"
)

// TestTrustWaypointForwarded: on unless TRUST_WAYPOINT_FORWARDED says false;
// a value that is not a boolean stops start-up naming the variable.
func TestTrustWaypointForwarded(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{
		{nil, true},
		{[]string{"TRUST_WAYPOINT_FORWARDED=true"}, true},
		{[]string{"TRUST_WAYPOINT_FORWARDED=false"}, false},
	} {
		c, err := Load(tc.env)
		if err != nil || c.TrustWaypointForwarded != tc.want {
			t.Errorf("Load(%q).TrustWaypointForwarded = %v, %v; want %v", tc.env, c.TrustWaypointForwarded, err, tc.want)
		}
	}
	if _, err := Load([]string{"TRUST_WAYPOINT_FORWARDED=maybe"}); err == nil || !strings.Contains(err.Error(), "TRUST_WAYPOINT_FORWARDED") {
		t.Errorf("Load(TRUST_WAYPOINT_FORWARDED=maybe) error = %v, want one naming the variable", err)
	}
}

// TestEarlyData: HBONE_EARLY_DATA is on unless it says false.
func TestEarlyData(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{
		{nil, true},
		{[]string{"HBONE_EARLY_DATA=false"}, false},
	} {
		if c, err := Load(tc.env); err != nil || c.EarlyData != tc.want {
			t.Errorf("Load(%q).EarlyData = %v, %v; want %v", tc.env, c.EarlyData, err, tc.want)
		}
	}
	if _, err := Load([]string{"HBONE_EARLY_DATA=soon"}); err == nil || !strings.Contains(err.Error(), "HBONE_EARLY_DATA") {
		t.Errorf("Load(HBONE_EARLY_DATA=soon) error = %v, want one naming the variable", err)
	}
}
