package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"runtime/trace"
	"strconv"
	"strings"
	"testing"
	"time"
)

// spinForStallTest keeps its goroutine on a P for d, as a push's decoding
// does.
//
//go:noinline
func spinForStallTest(d time.Duration) int {
	n := 0
	for start := time.Now(); time.Since(start) < d; n++ {
	}
	return n
}

// TestStallReport traces this process while a goroutine computes for
// 60 ms, logs a 20 ms round trip in its middle as the probe would, and
// checks that the report names that goroutine as holding a P for the whole
// round trip, and leaves out a round trip shorter than the minimum.
func TestStallReport(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "xds-push-gozt-in.trace"))
	if err != nil {
		t.Fatal(err)
	}
	if err := trace.Start(f); err != nil {
		t.Fatal(err)
	}
	// A trace's first clock snapshot comes with its first generation; a
	// second one (a generation a second later at most) is not needed.
	start := time.Now()
	done := make(chan int)
	go func() { done <- spinForStallTest(60 * time.Millisecond) }()
	<-done
	trace.Stop()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	log, err := newStallLog(filepath.Join(dir, "xds-push-probe.stalls"))
	if err != nil {
		t.Fatal(err)
	}
	log.add(start.Add(20*time.Millisecond), 20*time.Millisecond)
	log.add(start.Add(5*time.Millisecond), 3*time.Millisecond) // under the report's minimum
	log.add(start.Add(50*time.Millisecond), time.Millisecond)  // under the log's
	if err := log.close(); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := StallReport(&out, dir, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", out.String())
	report := out.String()
	if !strings.HasPrefix(report, "1 round trips of 5ms or more") {
		t.Fatalf("want one round trip explained, got:\n%s", report)
	}
	// Each run of the spinning goroutine that overlaps the round trip is
	// listed with its P; together they cover it (the runtime preempts a
	// goroutine every 10 ms, and the report lists runs of 0.5 ms or more).
	re := regexp.MustCompile(`([-+][0-9.]+)\.\. *([-+][0-9.]+) ms +P[0-9]+ +g[0-9]+ [0-9.]+ ms +.*spinForStallTest`)
	var covered float64
	for _, m := range re.FindAllStringSubmatch(report, -1) {
		from, _ := strconv.ParseFloat(m[1], 64)
		to, _ := strconv.ParseFloat(m[2], 64)
		covered += min(to, 20) - max(from, 0)
	}
	if covered < 15 {
		t.Errorf("the spinning goroutine's runs cover %.1f ms of the 20 ms round trip, want most of it:\n%s", covered, report)
	}
	if !strings.Contains(report, "xds-push-gozt-in:") {
		t.Errorf("the report does not name the traced process:\n%s", report)
	}
}

// TestStallReportNeedsItsFiles: without a probe's log or without traces,
// the report says what is missing instead of explaining nothing.
func TestStallReportNeedsItsFiles(t *testing.T) {
	dir := t.TempDir()
	// Through gozt bench's flag, as an operator runs it.
	err := Run(context.Background(), []string{"--stalls", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no *.stalls file") {
		t.Fatalf("empty dir: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.stalls"), []byte("1 2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := StallReport(&bytes.Buffer{}, dir, time.Millisecond); err == nil || !strings.Contains(err.Error(), "x.stalls:1") {
		t.Fatalf("bad line: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.stalls"), []byte("1000 9000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := StallReport(&bytes.Buffer{}, dir, time.Millisecond); err == nil || !strings.Contains(err.Error(), "no *.trace file") {
		t.Fatalf("no traces: %v", err)
	}
}
