//go:build spiffeid_charset_backcompat

package identity

// go-spiffe's spiffeid_charset_backcompat build tag makes spiffeid accept
// sub-delims, '~', ':', '@', '[' and ']' in SPIFFE IDs. Parse relies on
// spiffeid for the strict character set (TESTPLAN S18), so gozt refuses to
// build with that tag.
var _ int = "gozt: do not build with the spiffeid_charset_backcompat tag: it loosens SPIFFE ID parsing (TESTPLAN S18)"
