// Package identity defines the SPIFFE workload identity used across gozt:
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
//
// It depends only on the standard library so that every package (rbac,
// proxy/state, xds, certs, hbone) can share the value type.
package identity

import (
	"errors"
	"fmt"
	"strings"
)

const (
	scheme = "spiffe://"

	// maxTrustDomainLen is the SPIFFE limit on the trust domain name
	// (SPIFFE-ID spec §2.1: at most 255 bytes).
	maxTrustDomainLen = 255
	// maxIDLen is the SPIFFE limit on the whole URI (SPIFFE-ID spec §2.3:
	// at most 2048 bytes).
	maxIDLen = 2048
)

// Errors returned by Parse, wrapped with the offending input.
var (
	ErrNotSPIFFE        = errors.New("identity: not a spiffe:// URI")
	ErrTooLong          = errors.New("identity: too long")
	ErrBadTrustDomain   = errors.New("identity: invalid trust domain")
	ErrBadPath          = errors.New("identity: path is not /ns/<namespace>/sa/<service account>")
	ErrBadSegment       = errors.New("identity: invalid path segment")
	errEmptyTrustDomain = fmt.Errorf("%w: empty", ErrBadTrustDomain)
)

// Identity is a SPIFFE workload identity spiffe://<td>/ns/<ns>/sa/<sa>.
// The zero value means "no identity".
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// Parse parses s strictly: exactly "spiffe://" td "/ns/" ns "/sa/" sa with
// every part non-empty. The trust domain may hold only lower-case ASCII
// letters, digits, '.', '-' and '_'; namespace and service account only
// ASCII letters, digits, '.', '-' and '_' and may not be "." or ".." (the
// SPIFFE path-segment alphabet). So control bytes (NUL included), '/',
// '%' (percent-encoding), '?', '#', '@', ':' and upper-case trust domains
// are all rejected. A successful Parse round-trips: Parse(s).String() == s.
func Parse(s string) (Identity, error) {
	if len(s) > maxIDLen {
		return Identity{}, fmt.Errorf("%w: %d bytes", ErrTooLong, len(s))
	}
	rest, ok := strings.CutPrefix(s, scheme)
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q", ErrNotSPIFFE, s)
	}
	td, path, ok := strings.Cut(rest, "/")
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q", ErrBadPath, s)
	}
	if err := checkTrustDomain(td); err != nil {
		return Identity{}, fmt.Errorf("%w: %q", err, s)
	}
	// path is "ns/<ns>/sa/<sa>": exactly four segments.
	parts := strings.Split(path, "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" {
		return Identity{}, fmt.Errorf("%w: %q", ErrBadPath, s)
	}
	for _, seg := range []string{parts[1], parts[3]} {
		if err := checkSegment(seg); err != nil {
			return Identity{}, fmt.Errorf("%w: %q", err, s)
		}
	}
	return Identity{TrustDomain: td, Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// MustParse is like Parse but panics on error. It is meant for tests and
// constants.
func MustParse(s string) Identity {
	id, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return id
}

func checkTrustDomain(td string) error {
	if td == "" {
		return errEmptyTrustDomain
	}
	if len(td) > maxTrustDomainLen {
		return fmt.Errorf("%w: longer than %d bytes", ErrBadTrustDomain, maxTrustDomainLen)
	}
	for i := 0; i < len(td); i++ {
		if !isTrustDomainByte(td[i]) {
			return fmt.Errorf("%w: byte %#x", ErrBadTrustDomain, td[i])
		}
	}
	return nil
}

func checkSegment(seg string) error {
	switch seg {
	case "":
		return fmt.Errorf("%w: empty", ErrBadSegment)
	case ".", "..":
		return fmt.Errorf("%w: dot segment", ErrBadSegment)
	}
	for i := 0; i < len(seg); i++ {
		if !isSegmentByte(seg[i]) {
			return fmt.Errorf("%w: byte %#x", ErrBadSegment, seg[i])
		}
	}
	return nil
}

// isTrustDomainByte reports whether b may appear in a SPIFFE trust domain.
func isTrustDomainByte(b byte) bool {
	return 'a' <= b && b <= 'z' || '0' <= b && b <= '9' || b == '.' || b == '-' || b == '_'
}

// isSegmentByte reports whether b may appear in a SPIFFE path segment.
func isSegmentByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		b == '.' || b == '-' || b == '_'
}

// String returns "spiffe://td/ns/NS/sa/SA", or "" for the zero Identity.
func (id Identity) String() string {
	if id.IsZero() {
		return ""
	}
	return scheme + id.Principal()
}

// IsZero reports whether id is the zero Identity.
func (id Identity) IsZero() bool {
	return id == Identity{}
}

// Principal returns String() without the "spiffe://" prefix
// ("td/ns/NS/sa/SA"), which is what RBAC principals are compared against.
// It returns "" for the zero Identity.
func (id Identity) Principal() string {
	if id.IsZero() {
		return ""
	}
	return id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}
