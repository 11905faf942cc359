package inpod

import "time"

// backoff is the reconnect delay: min, doubling up to max (SPEC §9: 10ms
// doubling to 15s). The zero cur means the next delay is min.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

// next returns the delay before the next attempt and doubles the one after.
func (b *backoff) next() time.Duration {
	b.cur = nextBackoff(b.cur, b.min, b.max)
	return b.cur
}

// reset makes the next delay min again.
func (b *backoff) reset() { b.cur = 0 }

// nextBackoff returns the delay after prev: min first (prev <= 0), then
// twice prev, capped at max.
func nextBackoff(prev, min, max time.Duration) time.Duration {
	switch {
	case prev <= 0:
		return min
	case prev >= max/2:
		return max
	default:
		return 2 * prev
	}
}
