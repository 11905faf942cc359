package xds

import (
	"math/rand/v2"
	"time"
)

// Backoff configures the delay before the client reconnects (SPEC §5.1).
// The zero value is ztunnel's policy: 10ms after a clean or benign end of
// the stream, and after errors a delay that doubles from 10ms up to 15s,
// each delay jittered down by up to half so that many clients restarted
// together do not reconnect in step (TESTPLAN F6).
type Backoff struct {
	// Initial is the delay after a benign termination and the base of the
	// exponential delay. If zero, 10ms is used.
	Initial time.Duration
	// Max caps the exponential delay. If zero, 15s is used.
	Max time.Duration
	// Jitter is the largest fraction of a delay that is randomly removed,
	// in [0, 1]. If zero, 0.5 is used; a negative value disables jitter.
	Jitter float64
}

func (b Backoff) initial() time.Duration {
	if b.Initial <= 0 {
		return 10 * time.Millisecond
	}
	return b.Initial
}

func (b Backoff) max() time.Duration {
	if b.Max <= 0 {
		return 15 * time.Second
	}
	return max(b.Max, b.initial())
}

func (b Backoff) jitter() float64 {
	switch {
	case b.Jitter < 0:
		return 0
	case b.Jitter == 0:
		return 0.5
	case b.Jitter > 1:
		return 1
	}
	return b.Jitter
}

// backoffState is the reconnect delay state of one client. Like ztunnel, it
// doubles the delay on each failure and resets it only on a benign end:
// a server that accepts streams and then fails them keeps backing off.
type backoffState struct {
	cfg  Backoff
	cur  time.Duration  // the next failure's delay, before jitter
	rand func() float64 // in [0, 1)
}

func newBackoffState(cfg Backoff, rnd func() float64) *backoffState {
	if rnd == nil {
		rnd = rand.Float64
	}
	return &backoffState{cfg: cfg, cur: cfg.initial(), rand: rnd}
}

// benign returns the delay after a clean or benign termination and resets
// the exponential delay.
func (s *backoffState) benign() time.Duration {
	s.cur = s.cfg.initial()
	return s.jittered(s.cur)
}

// failure returns the current exponential delay, jittered, and doubles it
// (up to Max) for the next failure: 10ms, 20ms, 40ms, ... 15s.
func (s *backoffState) failure() time.Duration {
	d := s.cur
	s.cur = min(s.cur*2, s.cfg.max())
	return s.jittered(d)
}

// jittered removes a random fraction (up to the configured jitter) of d.
func (s *backoffState) jittered(d time.Duration) time.Duration {
	j := s.cfg.jitter()
	if j == 0 {
		return d
	}
	return d - time.Duration(float64(d)*j*s.rand())
}
