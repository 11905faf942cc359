package explain

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/gozt/gozt/certs/identity"
)

// Query is one question: would src (with identity) be allowed to reach dst?
type Query struct {
	// Src is the client address as the destination's proxy sees it (for
	// HBONE, the peer's IP; its port rarely matters and may be 0).
	Src netip.AddrPort
	// Identity is the client's SPIFFE identity; the zero value asks about a
	// plaintext connection, which has none.
	Identity identity.Identity
	// Dst is the destination pod's IP and the target port (after service
	// port translation, never 15008).
	Dst netip.AddrPort
	// Network is the destination's network ("" is the default network).
	Network string
}

// Query parameters, which are also the names Run's flags use.
const (
	paramSrc      = "src"
	paramIdentity = "identity"
	paramDst      = "dst"
	paramNetwork  = "network"
)

var knownParams = []string{paramSrc, paramIdentity, paramDst, paramNetwork}

// QueryError is a bad query parameter; an HTTP handler answers it with 400.
type QueryError struct {
	Param string // the parameter's name
	Msg   string
}

func (e *QueryError) Error() string { return e.Param + ": " + e.Msg }

func queryErr(param, format string, args ...any) error {
	return &QueryError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// ParseQuery reads a query from URL parameters:
//
//	src=IP[:port]   required; the port is optional (0 when absent); IPv6 with
//	                a port is written [addr]:port
//	identity=ID     optional SPIFFE ID spiffe://td/ns/NS/sa/SA
//	dst=IP:port     required; port 1–65535
//	network=NAME    optional; the destination's network
//
// Unknown and repeated parameters are rejected, so a misspelt "identiy"
// cannot silently turn the question into a plaintext one. Every error is a
// *QueryError naming the parameter.
func ParseQuery(v url.Values) (Query, error) {
	for _, name := range sortedKeys(v) {
		if !slices.Contains(knownParams, name) {
			return Query{}, queryErr(name, "unknown parameter (want %s)", strings.Join(knownParams, ", "))
		}
		if len(v[name]) > 1 {
			return Query{}, queryErr(name, "given %d times", len(v[name]))
		}
	}
	var q Query
	var err error
	if q.Src, err = parseSrc(v.Get(paramSrc)); err != nil {
		return Query{}, err
	}
	if q.Dst, err = parseDst(v.Get(paramDst)); err != nil {
		return Query{}, err
	}
	if s := v.Get(paramIdentity); s != "" {
		if q.Identity, err = identity.Parse(s); err != nil {
			return Query{}, queryErr(paramIdentity, "%v", err)
		}
	}
	q.Network = v.Get(paramNetwork)
	return q, nil
}

func sortedKeys(v url.Values) []string {
	keys := make([]string, 0, len(v))
	for k := range v {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// parseSrc parses IP, IP:port, [IPv6]:port or [IPv6].
func parseSrc(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, queryErr(paramSrc, "required (IP or IP:port)")
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		if a.Zone() != "" {
			return netip.AddrPort{}, queryErr(paramSrc, "%q: zoned addresses are not supported", s)
		}
		return netip.AddrPortFrom(a, 0), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, queryErr(paramSrc, "%q is not IP or IP:port", s)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, queryErr(paramSrc, "%q: zoned addresses are not supported", s)
	}
	return ap, nil
}

// parseDst parses IP:port or [IPv6]:port with a non-zero port.
func parseDst(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, queryErr(paramDst, "required (IP:port of the destination pod and target port)")
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		if _, aerr := netip.ParseAddr(s); aerr == nil {
			return netip.AddrPort{}, queryErr(paramDst, "%q has no port (want IP:port)", s)
		}
		return netip.AddrPort{}, queryErr(paramDst, "%q is not IP:port", s)
	}
	switch {
	case ap.Addr().Zone() != "":
		return netip.AddrPort{}, queryErr(paramDst, "%q: zoned addresses are not supported", s)
	case ap.Port() == 0:
		return netip.AddrPort{}, queryErr(paramDst, "%q: port must be 1-65535", s)
	}
	return ap, nil
}
