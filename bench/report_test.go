package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testReport() *Report {
	return &Report{
		Date:    "2026-01-02T03:04:05Z",
		Command: "gozt bench --quick",
		Quick:   true,
		Machine: Machine{Cores: 2, Kernel: "6.1.0", Go: "go1.26.0"},
		Results: []Result{
			row("HBONE upload", "throughput, 1 stream", 600, "MB/s", 3).vs("direct TCP", 2000).goal(Target{Bound: 0.30}),
			row("HBONE upload", "throughput, 1 stream", 600, "MB/s", 3).vs("x/net pair", 500).goal(Target{Bound: 1.5}),
			row("idle memory", "outbound | per conn", 5000, "B", 3).vs("x/net <pair> & co", 15000).goal(Target{OnValue: true, Max: true, Bound: 8192}),
			row("xDS push", "apply time", 1.25, "s", 3),
			row("passthrough", "throughput", 900, "MB/s", 3).note("HAProxy row skipped: not installed"),
		},
		Notes: []string{"a note"},
	}
}

func TestTarget(t *testing.T) {
	tests := []struct {
		name string
		t    Target
		r    Result
		want bool
		str  string
	}{
		{"ratio at least, met", Target{Bound: 0.3}, Result{Ratio: 0.31, Value: 0.1}, true, "ratio ≥ 0.3"},
		{"ratio at least, on the bound", Target{Bound: 0.3}, Result{Ratio: 0.3}, true, "ratio ≥ 0.3"},
		{"ratio at least, missed", Target{Bound: 1.5}, Result{Ratio: 1.49, Value: 99}, false, "ratio ≥ 1.5"},
		{"ratio at most, met", Target{Max: true, Bound: 0.7}, Result{Ratio: 0.5}, true, "ratio ≤ 0.7"},
		{"ratio at most, missed", Target{Max: true, Bound: 1.01}, Result{Ratio: 1.02}, false, "ratio ≤ 1.01"},
		{"ratio at most, no ratio", Target{Max: true, Bound: 0.7}, Result{Ratio: 0, Value: 9994, BaselineValue: -811}, false, "ratio ≤ 0.7"},
		{"value at most, met", Target{OnValue: true, Max: true, Bound: 8192}, Result{Value: 8000, Ratio: 9}, true, "value ≤ 8192"},
		{"value at most, missed", Target{OnValue: true, Max: true, Bound: 5}, Result{Value: 6, Ratio: 0.1}, false, "value ≤ 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.t.met(tt.r); got != tt.want {
				t.Errorf("%v.met(%+v) = %v, want %v", tt.t, tt.r, got, tt.want)
			}
			if got := tt.t.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
		})
	}
}

func TestResultBuilders(t *testing.T) {
	got := row("s", "m", 300, "MB/s", 5).vs("direct TCP", 1000).goal(Target{Bound: 0.3}).note("a").note("b")
	met := true
	want := Result{Scenario: "s", Metric: "m", Value: 300, Unit: "MB/s", Baseline: "direct TCP", BaselineValue: 1000,
		Ratio: 0.3, Target: "ratio ≥ 0.3", TargetMet: &met, Samples: 5, Note: "a; b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("built result (-want +got):\n%s", diff)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSON(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	// The keys issue 5 requires, decoded without our own types.
	var doc struct {
		Results []map[string]any `json:"results"`
		Machine map[string]any   `json:"machine"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, b.String())
	}
	if len(doc.Results) != 5 {
		t.Fatalf("%d results, want 5", len(doc.Results))
	}
	for i, r := range doc.Results {
		for _, k := range []string{"scenario", "metric", "value", "unit", "baseline", "baseline_value", "ratio"} {
			if _, ok := r[k]; !ok {
				t.Errorf("result %d lacks %q: %v", i, k, r)
			}
		}
	}
	if got := doc.Results[1]["ratio"]; got != 1.2 {
		t.Errorf("results[1].ratio = %v, want 1.2", got)
	}
	if got := doc.Results[3]["baseline"]; got != "" {
		t.Errorf("a row without baseline has baseline %v, want \"\"", got)
	}
	if _, ok := doc.Results[3]["target_met"]; ok {
		t.Errorf("a row without target has target_met")
	}
	for _, k := range []string{"cores", "kernel", "go"} {
		if _, ok := doc.Machine[k]; !ok {
			t.Errorf("machine lacks %q: %v", k, doc.Machine)
		}
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(testReport(), &back); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := writeMarkdown(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"`gozt bench --quick` (--quick), 2026-01-02T03:04:05Z, 2 cores, Linux 6.1.0, go1.26.0.\n",
		"| scenario | metric | gozt | baseline | baseline value | ratio | target | |\n",
		"| HBONE upload | throughput, 1 stream | 600.0 MB/s | direct TCP | 2000 MB/s | 0.3× | ratio ≥ 0.3 | ✅ |\n",
		"| HBONE upload | throughput, 1 stream | 600.0 MB/s | x/net pair | 500.0 MB/s | 1.20× | ratio ≥ 1.5 | ❌ |\n",
		`| idle memory | outbound \| per conn | 5000 B | x/net <pair> & co | 15000 B | 0.333× | value ≤ 8192 | ✅ |` + "\n",
		"| xDS push | apply time | 1.25 s | — | — | — |  |  |\n",
		"| passthrough | throughput (HAProxy row skipped: not installed) | 900.0 MB/s |",
		"\n- a note\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Markdown lacks %q; got:\n%s", want, got)
		}
	}
	// Every table row has the same number of unescaped cells.
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "|") {
			if n := strings.Count(strings.ReplaceAll(line, `\|`, ""), "|"); n != 9 {
				t.Errorf("row has %d separators, want 9: %q", n, line)
			}
		}
	}
}

func TestWriteSVG(t *testing.T) {
	var b bytes.Buffer
	if err := writeSVG(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, one bar per row with a ratio, coloured by target.
	dec := xml.NewDecoder(&b)
	var fills []string
	var texts []string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if el.Name.Local == "rect" {
				for _, a := range el.Attr {
					if a.Name.Local == "fill" && a.Value != "#ffffff" {
						fills = append(fills, a.Value)
					}
				}
			}
		case xml.CharData:
			texts = append(texts, string(el))
		}
	}
	want := []string{"#2e7d32", "#c62828", "#2e7d32"} // met, missed, met
	if diff := cmp.Diff(want, fills); diff != "" {
		t.Errorf("bar colours (-want +got):\n%s", diff)
	}
	all := strings.Join(texts, "\n")
	for _, s := range []string{"idle memory · outbound | per conn ÷ x/net <pair> & co", "0.3×", "1.20×", "0.333×"} {
		if !strings.Contains(all, s) {
			t.Errorf("SVG text lacks %q", s)
		}
	}
	if strings.Contains(all, "apply time") {
		t.Errorf("SVG draws a row without a baseline")
	}
}

func TestFormatNum(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{0, "0"}, {0.30, "0.3"}, {0.12345, "0.123"}, {1.5, "1.50"}, {99.99, "99.99"}, {215.46, "215.5"}, {3374.4, "3374"}, {-12.5, "-12.50"},
	}
	for _, tt := range tests {
		if got := formatNum(tt.v); got != tt.want {
			t.Errorf("formatNum(%v) = %q, want %q", tt.v, got, tt.want)
		}
	}
}

// TestTunnelFloor checks the floor rows of the HBONE scenarios against
// figures worked out by hand: direct mTLS 2 CPU-s/GB and direct TCP 0.5 on
// the whole machine make a path of at least 3 CPU-s/GB, proxies of at least
// 2.5, and on 2 cores a ceiling of 2/3 GB/s.
func TestTunnelFloor(t *testing.T) {
	s := samples{}
	s.add("direct mTLS", map[string]float64{"throughput": 1000, "machine": 2})
	s.add("direct TCP", map[string]float64{"throughput": 4000, "machine": 0.5})
	s.add("gozt", map[string]float64{"throughput": 600, "machine": 3.3, "cpu": 2.6})
	rs := tunnelFloor("HBONE upload", s, 600, 1000, 1, 2)
	if len(rs) != 3 {
		t.Fatalf("got %d rows, want 3: %+v", len(rs), rs)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if r := rs[0]; !near(r.Value, 3.3) || !near(r.BaselineValue, 3) || !near(r.Ratio, 1.1) {
		t.Errorf("whole-machine row = %+v, want 3.3 against 3", r)
	}
	if r := rs[1]; !near(r.Value, 2.6) || !near(r.BaselineValue, 2.5) {
		t.Errorf("proxies row = %+v, want 2.6 against 2.5", r)
	}
	r := rs[2]
	if !near(r.BaselineValue, 2000.0/3) || !near(r.Ratio, 0.9) {
		t.Errorf("ceiling row = %+v, want 600 MB/s against 666.7", r)
	}
	if !strings.Contains(r.Note, "at most 0.67× direct mTLS") {
		t.Errorf("ceiling note = %q, want it to say 0.67× direct mTLS", r.Note)
	}
	if rs := tunnelFloor("HBONE upload", samples{}, 600, 1000, 1, 2); rs != nil {
		t.Errorf("without machine figures: %+v, want no rows", rs)
	}
}
