package bench

import (
	"math"
	"slices"
	"time"
)

// median returns the middle value of xs (the mean of the two middle values
// for an even count), or 0 for an empty slice. xs is not modified.
func median(xs []float64) float64 {
	return percentile(xs, 50)
}

// percentile returns the p-th percentile (0 ≤ p ≤ 100) of xs, interpolating
// linearly between the two closest ranks (Hyndman–Fan type 7, the default of
// R and NumPy), or 0 for an empty slice. xs is not modified.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	p = math.Max(0, math.Min(100, p))
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// ratio returns v ÷ base, or 0 when that says nothing: a quotient that is
// not a finite number (a zero or missing baseline, kept out of JSON), or a
// baseline that is not positive (an added latency whose direct reference
// had the larger outlier), where the sign of the quotient would mislead.
func ratio(v, base float64) float64 {
	r := v / base
	if base <= 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return 0
	}
	return r
}

// micros converts durations to microseconds.
func micros(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Microsecond)
	}
	return out
}

// samples collects, per variant and metric, the value of every repetition.
type samples map[string]map[string][]float64

func (s samples) add(variant string, m map[string]float64) {
	if s[variant] == nil {
		s[variant] = make(map[string][]float64)
	}
	for k, v := range m {
		s[variant][k] = append(s[variant][k], v)
	}
}

// median returns the median of variant's metric over the repetitions.
func (s samples) median(variant, metric string) float64 {
	return median(s[variant][metric])
}

// count is the number of repetitions recorded for variant's metric.
func (s samples) count(variant, metric string) int {
	return len(s[variant][metric])
}
