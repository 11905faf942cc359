package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Result is one row of the report: a figure gozt reached, the baseline it
// is compared with (measured in the same run) and their ratio.
type Result struct {
	Scenario      string  `json:"scenario"`
	Metric        string  `json:"metric"`
	Value         float64 `json:"value"`
	Unit          string  `json:"unit"`
	Baseline      string  `json:"baseline"`       // or "" when the row has no baseline
	BaselineValue float64 `json:"baseline_value"` // in Unit
	Ratio         float64 `json:"ratio"`          // Value ÷ BaselineValue, or 0 without a baseline
	Target        string  `json:"target,omitempty"`
	TargetMet     *bool   `json:"target_met,omitempty"`
	Samples       int     `json:"samples"` // repetitions behind the medians
	Note          string  `json:"note,omitempty"`
}

// Target is a goal from issue 5 for one row: a bound on its ratio or on
// its value.
type Target struct {
	OnValue bool    // the bound applies to Value (else to Ratio)
	Max     bool    // the figure must be at most Bound (else at least)
	Bound   float64 // in Unit when OnValue
}

func (t Target) String() string {
	op := "≥"
	if t.Max {
		op = "≤"
	}
	what := "ratio"
	if t.OnValue {
		what = "value"
	}
	return fmt.Sprintf("%s %s %s", what, op, strconv.FormatFloat(t.Bound, 'g', 4, 64))
}

// met reports whether r satisfies t. A ratio target is not met without a
// ratio (0: no baseline, or one that is not positive).
func (t Target) met(r Result) bool {
	x := r.Ratio
	if t.OnValue {
		x = r.Value
	} else if x == 0 {
		return false
	}
	if t.Max {
		return x <= t.Bound
	}
	return x >= t.Bound
}

// row starts a Result without a baseline.
func row(scenario, metric string, v float64, unit string, n int) Result {
	return Result{Scenario: scenario, Metric: metric, Value: v, Unit: unit, Samples: n}
}

// vs sets r's baseline and ratio.
func (r Result) vs(baseline string, bv float64) Result {
	r.Baseline, r.BaselineValue, r.Ratio = baseline, bv, ratio(r.Value, bv)
	return r
}

// goal sets r's target and whether it is met.
func (r Result) goal(t Target) Result {
	r.Target = t.String()
	met := t.met(r)
	r.TargetMet = &met
	return r
}

// note appends a remark to r.
func (r Result) note(s string) Result {
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += s
	return r
}

// Machine describes where the figures were measured.
type Machine struct {
	Cores  int    `json:"cores"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
	CPU    string `json:"cpu,omitempty"`
}

// Report is everything one run of the harness measured.
type Report struct {
	Date    string   `json:"date"`    // RFC 3339, when the run started
	Command string   `json:"command"` // how to reproduce it
	Quick   bool     `json:"quick"`
	Machine Machine  `json:"machine"`
	Results []Result `json:"results"`
	Notes   []string `json:"notes,omitempty"`
}

// writeJSON writes rep as indented JSON.
func writeJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// formatNum prints a figure with about four significant digits and no
// exponent for the magnitudes a report holds.
func formatNum(v float64) string {
	switch a := math.Abs(v); {
	case v == 0:
		return "0"
	case a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// writeMarkdown writes rep as a Markdown section: the command, date and
// machine, one table row per result, then the notes.
func writeMarkdown(w io.Writer, rep *Report) error {
	var b strings.Builder
	mode := "thorough"
	if rep.Quick {
		mode = "--quick"
	}
	fmt.Fprintf(&b, "`%s` (%s), %s, %d cores, Linux %s, %s%s.\n\n", rep.Command, mode, rep.Date,
		rep.Machine.Cores, rep.Machine.Kernel, rep.Machine.Go, cpuSuffix(rep.Machine.CPU))
	b.WriteString("| scenario | metric | gozt | baseline | baseline value | ratio | target | |\n")
	b.WriteString("|---|---|---:|---|---:|---:|---|---|\n")
	for _, r := range rep.Results {
		base, bv, rt := "—", "—", "—"
		if r.Baseline != "" {
			base, bv = mdEscape(r.Baseline), formatNum(r.BaselineValue)+" "+r.Unit
			rt = "n/a"
			if r.Ratio != 0 {
				rt = formatNum(r.Ratio) + "×"
			}
		}
		mark := ""
		if r.TargetMet != nil {
			mark = "✅"
			if !*r.TargetMet {
				mark = "❌"
			}
		}
		metric := mdEscape(r.Metric)
		if r.Note != "" {
			metric += " (" + mdEscape(r.Note) + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s | %s | %s | %s |\n", mdEscape(r.Scenario), metric,
			formatNum(r.Value), r.Unit, base, bv, rt, mdEscape(r.Target), mark)
	}
	if len(rep.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cpuSuffix(cpu string) string {
	if cpu == "" {
		return ""
	}
	return ", " + cpu
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// The SVG chart: one horizontal bar per result that has a ratio, on a log2
// axis centred on 1× so that "twice as fast" and "half as fast" look alike.
const (
	svgWidth   = 960
	svgLabelW  = 430 // left column: scenario, metric and baseline
	svgRowH    = 22
	svgTop     = 58
	svgMinLog2 = -3 // 0.125×
	svgMaxLog2 = 3  // 8×
)

// writeSVG draws the ratios of rep as a bar chart. Bars are green when the
// row's target is met, red when it is missed and grey without a target.
func writeSVG(w io.Writer, rep *Report) error {
	var rows []Result
	for _, r := range rep.Results {
		if r.Baseline != "" && r.Ratio > 0 {
			rows = append(rows, r)
		}
	}
	h := svgTop + len(rows)*svgRowH + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, h, svgWidth, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">gozt ÷ baseline (log scale; green: target met, red: missed, grey: no target)</text>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#555">%s</text>`+"\n",
		html.EscapeString(fmt.Sprintf("%s · %s · %d cores · Linux %s · %s", rep.Command, rep.Date, rep.Machine.Cores, rep.Machine.Kernel, rep.Machine.Go)))
	x0, x1 := float64(svgLabelW), float64(svgWidth-70)
	xOf := func(r float64) float64 {
		l := math.Max(svgMinLog2, math.Min(svgMaxLog2, math.Log2(r)))
		return x0 + (l-svgMinLog2)/(svgMaxLog2-svgMinLog2)*(x1-x0)
	}
	bottom := svgTop + len(rows)*svgRowH
	for e := svgMinLog2; e <= svgMaxLog2; e++ {
		x := xOf(math.Pow(2, float64(e)))
		stroke := "#dddddd"
		if e == 0 {
			stroke = "#333333"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", x, svgTop-6, x, bottom, stroke)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s×</text>`+"\n", x, bottom+16, formatNum(math.Pow(2, float64(e))))
	}
	for i, r := range rows {
		y := svgTop + i*svgRowH
		label := fmt.Sprintf("%s · %s ÷ %s", r.Scenario, r.Metric, r.Baseline)
		fmt.Fprintf(&b, `<text x="10" y="%d">%s</text>`+"\n", y+15, html.EscapeString(truncate(label, 64)))
		color := "#90a4ae"
		if r.TargetMet != nil {
			color = "#2e7d32"
			if !*r.TargetMet {
				color = "#c62828"
			}
		}
		xa, xb := xOf(1), xOf(r.Ratio)
		if xb < xa {
			xa, xb = xb, xa
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`+"\n",
			xa, y+4, math.Max(xb-xa, 1), svgRowH-8, color, html.EscapeString(label+" = "+formatNum(r.Ratio)+"×"))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s×</text>`+"\n", x1+6, y+15, formatNum(r.Ratio))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
