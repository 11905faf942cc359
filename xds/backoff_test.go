package xds

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBackoffSequence(t *testing.T) {
	b := newBackoffState(Backoff{Jitter: -1}, nil)
	var got []time.Duration
	for range 14 {
		got = append(got, b.failure())
	}
	ms := time.Millisecond
	want := []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, 1280 * ms,
		2560 * ms, 5120 * ms, 10240 * ms, 15 * time.Second, 15 * time.Second, 15 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("failure delays = %v, want %v", got, want)
	}
	if d := b.benign(); d != 10*ms {
		t.Errorf("benign() = %v, want 10ms", d)
	}
	if d := b.failure(); d != 10*ms {
		t.Errorf("failure() after benign = %v, want 10ms (reset)", d)
	}
}

func TestBackoffConfig(t *testing.T) {
	b := newBackoffState(Backoff{Initial: time.Second, Max: 3 * time.Second, Jitter: -1}, nil)
	var got []time.Duration
	for range 4 {
		got = append(got, b.failure())
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("failure delays = %v, want %v", got, want)
	}
	// Max below Initial is raised to Initial.
	b = newBackoffState(Backoff{Initial: time.Second, Max: time.Millisecond, Jitter: -1}, nil)
	b.failure()
	if d := b.failure(); d != time.Second {
		t.Errorf("failure() with Max < Initial = %v, want 1s", d)
	}
}

// TestBackoffJitter: TESTPLAN F6. Clients that fail together spread their
// retries over [d/2, d] instead of retrying in step.
func TestBackoffJitter(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const clients = 200
	for step, d := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond} {
		var delays []time.Duration
		states := make([]*backoffState, clients)
		for i := range states {
			states[i] = newBackoffState(Backoff{}, r.Float64)
			for range step {
				states[i].failure()
			}
			delays = append(delays, states[i].failure())
		}
		slices.Sort(delays)
		lo, hi := delays[0], delays[len(delays)-1]
		if lo < d/2 || hi > d {
			t.Errorf("step %d: delays in [%v, %v], want within [%v, %v]", step, lo, hi, d/2, d)
		}
		if hi-lo < d*2/5 {
			t.Errorf("step %d: delays span %v, want at least %v", step, hi-lo, d*2/5)
		}
		// No tenth of the range holds more than a fifth of the clients.
		buckets := make([]int, 10)
		for _, x := range delays {
			i := min(int(float64(x-d/2)/float64(d/2)*10), 9)
			buckets[i]++
		}
		for i, n := range buckets {
			if n > clients/5 {
				t.Errorf("step %d: %d of %d clients in bucket %d: %v", step, n, clients, i, buckets)
			}
		}
	}
}
