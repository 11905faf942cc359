package identity

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Identity
		wantErr error
	}{
		{"ok", "spiffe://cluster.local/ns/default/sa/bookinfo", Identity{"cluster.local", "default", "bookinfo"}, nil},
		{"ok td chars", "spiffe://a-b_c.9/ns/x/sa/y", Identity{"a-b_c.9", "x", "y"}, nil},
		{"ok upper sa", "spiffe://td/ns/Ns/sa/SA.x-y_z", Identity{"td", "Ns", "SA.x-y_z"}, nil},
		{"empty", "", Identity{}, ErrNotSPIFFE},
		{"no scheme", "cluster.local/ns/a/sa/b", Identity{}, ErrNotSPIFFE},
		{"upper scheme", "SPIFFE://td/ns/a/sa/b", Identity{}, ErrNotSPIFFE},
		{"other scheme", "https://td/ns/a/sa/b", Identity{}, ErrNotSPIFFE},
		{"only td", "spiffe://td", Identity{}, ErrBadPath},
		{"td slash", "spiffe://td/", Identity{}, ErrBadPath},
		{"trailing slash", "spiffe://td/ns/a/sa/b/", Identity{}, ErrBadPath},
		{"extra segment", "spiffe://td/ns/a/sa/b/c", Identity{}, ErrBadPath},
		{"missing sa", "spiffe://td/ns/a", Identity{}, ErrBadPath},
		{"missing sa value", "spiffe://td/ns/a/sa", Identity{}, ErrBadPath},
		{"swapped", "spiffe://td/sa/a/ns/b", Identity{}, ErrBadPath},
		{"upper keyword", "spiffe://td/NS/a/sa/b", Identity{}, ErrBadPath},
		{"double slash", "spiffe://td//ns/a/sa/b", Identity{}, ErrBadPath},
		{"empty td", "spiffe:///ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"empty ns", "spiffe://td/ns//sa/b", Identity{}, ErrBadSegment},
		{"empty sa", "spiffe://td/ns/a/sa/", Identity{}, ErrBadSegment},
		{"upper td", "spiffe://Cluster.local/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"td port", "spiffe://td:443/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"td userinfo", "spiffe://u@td/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"nul in td", "spiffe://td\x00evil/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"nul in ns", "spiffe://td/ns/a\x00/sa/b", Identity{}, ErrBadSegment},
		{"nul in sa", "spiffe://td/ns/a/sa/b\x00.evil", Identity{}, ErrBadSegment},
		{"newline", "spiffe://td/ns/a/sa/b\n", Identity{}, ErrBadSegment},
		{"tab", "spiffe://td/ns/a\t/sa/b", Identity{}, ErrBadSegment},
		{"del", "spiffe://td/ns/a/sa/b\x7f", Identity{}, ErrBadSegment},
		{"percent", "spiffe://td/ns/a%2Fb/sa/c", Identity{}, ErrBadSegment},
		{"query", "spiffe://td/ns/a/sa/b?x=y", Identity{}, ErrBadSegment},
		{"fragment", "spiffe://td/ns/a/sa/b#f", Identity{}, ErrBadSegment},
		{"dot ns", "spiffe://td/ns/./sa/b", Identity{}, ErrBadSegment},
		{"dotdot sa", "spiffe://td/ns/a/sa/..", Identity{}, ErrBadSegment},
		{"space", "spiffe://td/ns/a b/sa/c", Identity{}, ErrBadSegment},
		{"non-ascii", "spiffe://td/ns/ä/sa/c", Identity{}, ErrBadSegment},
		// Characters go-spiffe's spiffeid_charset_backcompat tag would allow.
		{"tilde", "spiffe://td/ns/a~b/sa/c", Identity{}, ErrBadSegment},
		{"at in sa", "spiffe://td/ns/a/sa/b@c", Identity{}, ErrBadSegment},
		{"sub-delim in ns", "spiffe://td/ns/a+b/sa/c", Identity{}, ErrBadSegment},
		{"sub-delim in td", "spiffe://t!d/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"long td", "spiffe://" + strings.Repeat("a", 256) + "/ns/a/sa/b", Identity{}, ErrBadTrustDomain},
		{"too long", "spiffe://td/ns/a/sa/" + strings.Repeat("b", 2048), Identity{}, ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Parse(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if err == nil && got.String() != tt.in {
				t.Errorf("Parse(%q).String() = %q, want input", tt.in, got.String())
			}
		})
	}
}

func TestStringPrincipal(t *testing.T) {
	id := Identity{TrustDomain: "cluster.local", Namespace: "ns1", ServiceAccount: "sa1"}
	if got, want := id.String(), "spiffe://cluster.local/ns/ns1/sa/sa1"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := id.Principal(), "cluster.local/ns/ns1/sa/sa1"; got != want {
		t.Errorf("Principal() = %q, want %q", got, want)
	}
	if id.IsZero() {
		t.Errorf("IsZero() = true for %v", id)
	}
	var zero Identity
	if !zero.IsZero() || zero.String() != "" || zero.Principal() != "" {
		t.Errorf("zero Identity: IsZero=%v String=%q Principal=%q", zero.IsZero(), zero.String(), zero.Principal())
	}
	if (Identity{Namespace: "x"}).IsZero() {
		t.Errorf("IsZero() = true for partially set Identity")
	}
}

func TestMustParsePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("MustParse(bad) did not panic")
		}
	}()
	MustParse("spiffe://td/ns/a")
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"spiffe://cluster.local/ns/default/sa/default",
		"spiffe://td/ns/a/sa/b/",
		"spiffe://td/ns/a\x00/sa/b",
		"spiffe://TD/ns/a/sa/b",
		"spiffe://td/ns/%2e/sa/b",
		"spiffe:///ns//sa/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			if !id.IsZero() {
				t.Fatalf("Parse(%q) = %+v with error %v, want zero Identity", s, id, err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, id.String())
		}
		again, err := Parse(id.String())
		if err != nil || again != id {
			t.Fatalf("Parse(Parse(%q).String()) = %+v, %v; want %+v", s, again, err, id)
		}
		if "spiffe://"+id.Principal() != s {
			t.Fatalf("Principal() = %q for %q", id.Principal(), s)
		}
		for i := len("spiffe://"); i < len(s); i++ {
			if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
				c == '.' || c == '-' || c == '_' || c == '/') {
				t.Fatalf("Parse(%q) accepted byte %#x", s, c)
			}
		}
	})
}

// TestParseAllocs: Parse runs once per inbound connection (PeerIdentity), so
// a valid identity costs no allocation (STYLE 38).
func TestParseAllocs(t *testing.T) {
	const s = "spiffe://cluster.local/ns/default/sa/bookinfo"
	if n := testing.AllocsPerRun(100, func() { _, _ = Parse(s) }); n != 0 {
		t.Errorf("Parse(%q) allocates %v times, want 0", s, n)
	}
}
