package explain

import "net/url"

// Values returns q as URL parameters, the inverse of ParseQuery, for the
// round-trip tests.
func (q Query) Values() url.Values {
	v := url.Values{}
	if q.Src.Port() == 0 {
		v.Set(paramSrc, q.Src.Addr().String())
	} else {
		v.Set(paramSrc, q.Src.String())
	}
	v.Set(paramDst, q.Dst.String())
	if !q.Identity.IsZero() {
		v.Set(paramIdentity, q.Identity.String())
	}
	if q.Network != "" {
		v.Set(paramNetwork, q.Network)
	}
	return v
}
