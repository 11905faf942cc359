package telemetry

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDenialsRingBound: the ring keeps only its last n denials, newest
// first, however many are recorded, and counts them all.
func TestDenialsRingBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, add int
	}{
		{"empty", 4, 0},
		{"partial", 4, 3},
		{"full", 4, 4},
		{"wrapped", 4, 11},
		{"default size", 0, 3 * DefaultDenials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := NewDenials(tc.size)
			for i := range tc.add {
				ds.Record(Denial{Reason: fmt.Sprint(i)})
			}
			size := tc.size
			if size <= 0 {
				size = DefaultDenials
			}
			var want []string
			for i := tc.add - 1; i >= 0 && len(want) < size; i-- {
				want = append(want, fmt.Sprint(i))
			}
			recent, total := ds.Recent()
			got := []string{}
			for _, d := range recent {
				got = append(got, d.Reason)
			}
			if want == nil {
				want = []string{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Recent() after %d records in a ring of %d (-want +got):\n%s", tc.add, tc.size, diff)
			}
			if total != uint64(tc.add) {
				t.Errorf("Recent() total = %d, want %d", total, tc.add)
			}
			if len(ds.ring) != size {
				t.Errorf("ring grew to %d slots, want %d", len(ds.ring), size)
			}
		})
	}
}

// TestDenialsNil: a nil *Denials records nothing and lists nothing.
func TestDenialsNil(t *testing.T) {
	var ds *Denials
	ds.Record(Denial{Reason: "x"})
	if recent, total := ds.Recent(); len(recent) != 0 || total != 0 {
		t.Errorf("nil Denials Recent() = %v, %d; want none", recent, total)
	}
}
