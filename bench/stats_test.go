package bench

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"empty", nil, 0},
		{"one", []float64{7}, 7},
		{"odd unsorted", []float64{5, 1, 3}, 3},
		{"even takes the mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"outlier does not move it", []float64{1, 2, 3, 1000}, 2.5},
		{"negative", []float64{-3, -1, -2}, -2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]float64(nil), tt.xs...)
			if got := median(tt.xs); got != tt.want {
				t.Errorf("median(%v) = %v, want %v", tt.xs, got, tt.want)
			}
			if diff := cmp.Diff(in, tt.xs); diff != "" {
				t.Errorf("median modified its input (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var hundred []float64
	for i := 100; i >= 1; i-- {
		hundred = append(hundred, float64(i))
	}
	tests := []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"empty", nil, 50, 0},
		{"p0 is the minimum", hundred, 0, 1},
		{"p100 is the maximum", hundred, 100, 100},
		{"p50 of 1..100", hundred, 50, 50.5},
		{"p99 of 1..100 interpolates", hundred, 99, 99.01},
		{"p25 of two values", []float64{10, 20}, 25, 12.5},
		{"p beyond 100 clamps", []float64{1, 2}, 150, 2},
		{"negative p clamps", []float64{1, 2}, -5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.xs, tt.p); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("percentile(%d values, %v) = %v, want %v", len(tt.xs), tt.p, got, tt.want)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		v, base, want float64
	}{
		{300, 1000, 0.3},
		{1500, 1000, 1.5},
		{5, 0, 0},
		{0, 0, 0},
		{9994, -811, 0}, // an added p99 against a negative one: no ratio
		{-5, 10, -0.5},
		{math.NaN(), 1, 0},
		{math.Inf(1), 1, 0},
	}
	for _, tt := range tests {
		if got := ratio(tt.v, tt.base); got != tt.want {
			t.Errorf("ratio(%v, %v) = %v, want %v", tt.v, tt.base, got, tt.want)
		}
	}
}

func TestSamples(t *testing.T) {
	s := samples{}
	s.add("gozt", map[string]float64{"throughput": 100, "cpu": 1})
	s.add("gozt", map[string]float64{"throughput": 300, "cpu": 3})
	s.add("gozt", map[string]float64{"throughput": 200, "cpu": 2})
	s.add("direct", map[string]float64{"throughput": 1000})
	if got := s.median("gozt", "throughput"); got != 200 {
		t.Errorf("median(gozt, throughput) = %v, want 200", got)
	}
	if got := s.count("gozt", "cpu"); got != 3 {
		t.Errorf("count(gozt, cpu) = %d, want 3", got)
	}
	if got := s.median("direct", "cpu"); got != 0 {
		t.Errorf("median of a metric never recorded = %v, want 0", got)
	}
	if got := s.median("absent", "throughput"); got != 0 {
		t.Errorf("median of an unknown variant = %v, want 0", got)
	}
}
