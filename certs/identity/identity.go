// Package identity defines the SPIFFE workload identity used across gozt:
// spiffe://<trust domain>/ns/<namespace>/sa/<service account>.
//
// It depends only on the standard library and go-spiffe's spiffeid, so
// that every package (rbac, state, xds, certs, hbone) can share the
// value type.
package identity

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

const (
	scheme = "spiffe://"

	// maxTrustDomainLen is the SPIFFE limit on the trust domain name
	// (SPIFFE-ID spec §2.1: at most 255 bytes). spiffeid does not bound it.
	maxTrustDomainLen = 255
	// maxIDLen is the SPIFFE limit on the whole URI (SPIFFE-ID spec §2.3:
	// at most 2048 bytes). spiffeid does not bound it.
	maxIDLen = 2048
)

// Errors returned by Parse, wrapped with the offending input.
var (
	ErrNotSPIFFE      = errors.New("identity: not a spiffe:// URI")
	ErrTooLong        = errors.New("identity: too long")
	ErrBadTrustDomain = errors.New("identity: invalid trust domain")
	ErrBadPath        = errors.New("identity: path is not /ns/<namespace>/sa/<service account>")
	ErrBadSegment     = errors.New("identity: invalid path segment")
)

// Identity is a SPIFFE workload identity spiffe://<td>/ns/<ns>/sa/<sa>.
// The zero value means "no identity".
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// Parse parses s strictly (SPEC §6.1, TESTPLAN S18): s must be a SPIFFE ID
// as spiffeid.FromString accepts it, of exactly the form "spiffe://" td
// "/ns/" ns "/sa/" sa, at most 2048 bytes long with a trust domain of at
// most 255. spiffeid allows only lower-case ASCII letters, digits, '.', '-'
// and '_' in the trust domain, and ASCII letters, digits, '.', '-' and '_'
// in path segments, which must not be empty, "." or "..". So control bytes
// (NUL included), '%' (percent-encoding), '?', '#', '@', ':' and upper-case
// trust domains are all rejected. A successful Parse round-trips:
// Parse(s).String() == s.
func Parse(s string) (Identity, error) {
	if len(s) > maxIDLen {
		return Identity{}, fmt.Errorf("%w: %d bytes", ErrTooLong, len(s))
	}
	rest, ok := strings.CutPrefix(s, scheme)
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q", ErrNotSPIFFE, s)
	}
	td, path, _ := strings.Cut(rest, "/")
	ns, sa, ok := cutNamespaceSA(path)
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q", ErrBadPath, s)
	}
	if _, err := spiffeid.FromString(s); err != nil {
		// The shape is right, so either the trust domain or a namespace or
		// service account segment is at fault.
		if _, tdErr := spiffeid.TrustDomainFromString(td); tdErr != nil {
			return Identity{}, fmt.Errorf("%w: %q: %v", ErrBadTrustDomain, s, tdErr)
		}
		return Identity{}, fmt.Errorf("%w: %q: %v", ErrBadSegment, s, err)
	}
	if len(td) > maxTrustDomainLen {
		return Identity{}, fmt.Errorf("%w: %q: longer than %d bytes", ErrBadTrustDomain, s, maxTrustDomainLen)
	}
	return Identity{TrustDomain: td, Namespace: ns, ServiceAccount: sa}, nil
}

// cutNamespaceSA splits path, a SPIFFE ID's path without its leading '/',
// into the NS and SA of "ns/NS/sa/SA". It reports false for any other
// number of segments or other keywords. NS and SA may still be invalid
// segments (empty, say); spiffeid checks them.
func cutNamespaceSA(path string) (ns, sa string, ok bool) {
	nsKey, rest, ok1 := strings.Cut(path, "/")
	ns, rest, ok2 := strings.Cut(rest, "/")
	saKey, sa, ok3 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || !ok3 || nsKey != "ns" || saKey != "sa" || strings.Contains(sa, "/") {
		return "", "", false
	}
	return ns, sa, true
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
