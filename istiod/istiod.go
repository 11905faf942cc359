// Package istiod holds the rules both of gozt's connections to istiod (the
// delta xDS stream, package xds, and the CA, package certs/istioca) share:
// the form of XDS_ADDRESS / CA_ADDRESS, and which extra gRPC metadata
// (XDS_HEADER_<NAME>, CA_HEADER_<NAME>) may be sent (SPEC §0.3). It imports
// only the standard library.
package istiod

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
)

// Metadata keys gozt itself sends on every request; an extra header may not
// replace them.
const (
	KeyAuthorization = "authorization"
	KeyClusterID     = "clusterid"
)

// HostPort returns the host:port to dial for an istiod address:
// "https://host[:port]", or a bare "host[:port]" meaning https (ztunnel
// prepends "https://" to an address without a scheme). A missing port is
// https's 443. Any other scheme, a path, query, fragment or user info is an
// error naming the address; so is an empty address, which never means "no
// CA" or "fake CA" (TESTPLAN S29).
func HostPort(addr string) (string, error) {
	if addr == "" {
		return "", errors.New("empty address")
	}
	raw := addr
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", addr, err)
	}
	switch {
	case u.Scheme != "https":
		return "", fmt.Errorf("address %q: scheme %q, want https", addr, u.Scheme)
	case u.Hostname() == "":
		return "", fmt.Errorf("address %q: no host", addr)
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "", u.User != nil:
		return "", fmt.Errorf("address %q: want https://host:port", addr)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// Headers validates extra metadata and returns it as key/value pairs with
// lower-case keys, sorted by key. A name must be valid gRPC metadata (0-9
// a-z _ - .), not binary ("-bin"), not gRPC's own ("grpc-") and not one gozt
// sends itself (authorization, clusterid); a value must be printable ASCII.
func Headers(h map[string]string) ([]string, error) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return strings.ToLower(keys[i]) < strings.ToLower(keys[j]) })
	kv := make([]string, 0, 2*len(h))
	for _, k := range keys {
		v := h[k]
		key := strings.ToLower(k)
		switch {
		case !ValidName(key):
			return nil, fmt.Errorf("header %q: invalid gRPC metadata name", k)
		case key == KeyAuthorization || key == KeyClusterID || strings.HasPrefix(key, "grpc-"):
			return nil, fmt.Errorf("header %q: reserved name", k)
		case strings.HasSuffix(key, "-bin"):
			return nil, fmt.Errorf("header %q: binary metadata not supported", k)
		case !ValidValue(v):
			return nil, fmt.Errorf("header %q: value must be printable ASCII", k)
		}
		kv = append(kv, key, v)
	}
	return kv, nil
}

// ValidName reports whether s is a valid gRPC metadata key: 0-9 a-z _ - .
// ("Custom-Metadata" in gRPC over HTTP/2).
func ValidName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// ValidValue reports whether s is a valid ASCII metadata value: printable
// ASCII and space.
func ValidValue(s string) bool {
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
