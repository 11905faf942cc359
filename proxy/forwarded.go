package proxy

import (
	"net/netip"
	"strings"
)

// This file reads the client address of a Forwarded header (RFC 7239), the
// one gozt trusts from a destination's own waypoint (SPEC §2.5).
//
// The grammar (RFC 7239 §4, with RFC 7230's list and quoted-string rules):
//
//	Forwarded         = 1#forwarded-element
//	forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] )
//	forwarded-pair    = token "=" value
//	value             = token / quoted-string
//
// and a for= value is a node (§6):
//
//	node     = nodename [ ":" node-port ]
//	nodename = IPv4address / "[" IPv6address "]" / "unknown" / obfnode
//
// The parser is strict where looseness would be ambiguous: a syntax error
// anywhere (an unterminated quote, a parameter twice in one element, a bare
// ':' or '[' outside quotes, whitespace around '=') discards the whole
// header, so no reading of a malformed list can pick a different "last"
// element than another. It accepts optional whitespace around ',' (RFC 7230
// §7) and, as senders commonly write it, around ';'. Only the last element
// is interpreted: its for= must be an IP literal, else (unknown, obfuscated,
// absent, not a node) there is no address. Nothing here allocates unless
// that for= value holds quoted-pairs.

// forwardedFor returns the IP of the for= parameter of the last element of
// the Forwarded header whose field values are fields (several fields are one
// comma-separated list, RFC 7230 §3.2.2), or the zero Addr when the header
// is absent or malformed or that parameter is not an IP. IPv4-mapped IPv6
// addresses are unmapped.
func forwardedFor(fields []string) netip.Addr {
	var last netip.Addr
	for _, f := range fields {
		addr, seen, ok := lastForwardedFor(f)
		if !ok {
			return netip.Addr{}
		}
		if seen {
			last = addr
		}
	}
	return last
}

// lastForwardedFor parses one field value. It reports whether the field has
// a non-empty element (seen), the for= IP of its last one, and whether the
// field is well-formed (ok).
func lastForwardedFor(s string) (addr netip.Addr, seen, ok bool) {
	p := forwardedParser{s: s}
	for {
		p.skipOWS()
		if p.done() {
			return addr, seen, true
		}
		if p.peek() == ',' { // an empty list element (RFC 7230 §7)
			p.i++
			continue
		}
		a, ok := p.element()
		if !ok {
			return netip.Addr{}, false, false
		}
		addr, seen = a, true
		p.skipOWS()
		if p.done() {
			return addr, seen, true
		}
		if p.peek() != ',' {
			return netip.Addr{}, false, false
		}
		p.i++
	}
}

// forwardedParser walks one Forwarded field value.
type forwardedParser struct {
	s string
	i int
}

func (p *forwardedParser) done() bool { return p.i >= len(p.s) }
func (p *forwardedParser) peek() byte { return p.s[p.i] }

func (p *forwardedParser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

// forwardedParams are the parameters of RFC 7239 §5, for the at-most-once
// rule of §4; an extension parameter may repeat as far as this parser cares.
var forwardedParams = [...]string{"by", "for", "host", "proto"}

// element parses one forwarded-element up to (not including) the ',' or
// the end that follows it, and returns its for= IP. It reports false on a
// syntax error.
func (p *forwardedParser) element() (netip.Addr, bool) {
	var addr netip.Addr
	var seen [len(forwardedParams)]bool
	for {
		p.skipOWS()
		if !p.done() && p.peek() != ';' && p.peek() != ',' {
			name, ok := p.token()
			if !ok || p.done() || p.peek() != '=' {
				return netip.Addr{}, false
			}
			p.i++
			v, escaped, ok := p.value()
			if !ok {
				return netip.Addr{}, false
			}
			for k, param := range forwardedParams {
				if !strings.EqualFold(name, param) {
					continue
				}
				if seen[k] {
					return netip.Addr{}, false // RFC 7239 §4: at most once
				}
				seen[k] = true
				if param == "for" {
					if escaped {
						v = unescapeQuoted(v)
					}
					addr = parseNodeIP(v)
				}
			}
			p.skipOWS()
		}
		if p.done() || p.peek() == ',' {
			return addr, true
		}
		if p.peek() != ';' {
			return netip.Addr{}, false
		}
		p.i++
	}
}

// token parses a non-empty RFC 7230 token.
func (p *forwardedParser) token() (string, bool) {
	start := p.i
	for !p.done() && isTChar(p.peek()) {
		p.i++
	}
	return p.s[start:p.i], p.i > start
}

// value parses a token or a quoted-string and returns it without its
// quotes; escaped reports whether it still holds quoted-pairs (RFC 7230
// §3.2.6), which only a value that is read needs undone.
func (p *forwardedParser) value() (v string, escaped, ok bool) {
	if p.done() {
		return "", false, false
	}
	if p.peek() != '"' {
		v, ok = p.token()
		return v, false, ok
	}
	p.i++
	start := p.i
	for !p.done() {
		c := p.peek()
		p.i++
		switch {
		case c == '"':
			return p.s[start : p.i-1], escaped, true
		case c == '\\': // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
			if p.done() || !isQDText(p.peek()) && p.peek() != '"' && p.peek() != '\\' {
				return "", false, false
			}
			p.i++
			escaped = true
		case !isQDText(c):
			return "", false, false
		}
	}
	return "", false, false // unterminated
}

// unescapeQuoted removes the backslashes of the quoted-pairs of a
// well-formed quoted-string body.
func unescapeQuoted(v string) string {
	var b strings.Builder
	b.Grow(len(v))
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// isTChar reports whether c is an RFC 7230 tchar.
func isTChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isQDText reports whether c may appear unescaped in a quoted-string:
// HTAB, SP, VCHAR except '"' and '\', and obs-text.
func isQDText(c byte) bool {
	return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) || (c >= 0x5d && c <= 0x7e) || c >= 0x80
}

// parseNodeIP returns the IP of an RFC 7239 §6 node, or the zero Addr when
// the node is "unknown", obfuscated or not a node at all. An IPv4 node is a
// dotted quad without leading zeros, an IPv6 one is bracketed and has no
// zone; the port, if any, is 1–5 digits or an obfuscated port, and ignored.
func parseNodeIP(v string) netip.Addr {
	host, port, hasPort := v, "", false
	bracketed := strings.HasPrefix(v, "[")
	if bracketed {
		end := strings.IndexByte(v, ']')
		if end < 0 {
			return netip.Addr{}
		}
		host, port = v[1:end], v[end+1:]
		if port != "" {
			if port[0] != ':' {
				return netip.Addr{}
			}
			port, hasPort = port[1:], true
		}
	} else {
		host, port, hasPort = strings.Cut(v, ":")
	}
	if hasPort && !validNodePort(port) {
		return netip.Addr{}
	}
	if !bracketed && !isDottedQuad(host) {
		return netip.Addr{} // "unknown", an obfnode, or not a node
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Is4() == bracketed || a.Zone() != "" {
		return netip.Addr{}
	}
	return a.Unmap()
}

// isDottedQuad reports whether s is made only of digits and dots, the
// characters of RFC 3986's IPv4address (netip checks the rest).
func isDottedQuad(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return s != ""
}

// validNodePort reports whether s is an RFC 7239 node-port: 1–5 digits, or
// "_" followed by letters, digits, '.', '_' or '-'.
func validNodePort(s string) bool {
	if strings.HasPrefix(s, "_") {
		return validObfuscated(s[1:])
	}
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validObfuscated reports whether s is 1*( ALPHA / DIGIT / "." / "_" / "-" ).
func validObfuscated(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return s != ""
}
