package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestRunCommands(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr error
		wantOut string
	}{
		{args: []string{"version"}, wantOut: "gozt "},
		{args: []string{"help"}, wantOut: "usage: gozt"},
		{args: []string{"bogus"}, wantErr: errUsage},
		{args: nil, wantErr: errUsage},
	} {
		var out, errOut bytes.Buffer
		err := run(tc.args, &out, &errOut)
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("run(%q) error = %v, want %v", tc.args, err, tc.wantErr)
		}
		if !strings.Contains(out.String(), tc.wantOut) {
			t.Errorf("run(%q) output = %q, want it to contain %q", tc.args, out.String(), tc.wantOut)
		}
	}
	// Shared mode (the default, as in Istio's chart) starts like the chart
	// starts it; with no root certificate mounted it stops with one line
	// naming the setting instead of crashing.
	t.Setenv("PROXY_MODE", "")
	t.Chdir(t.TempDir())
	if err := run([]string{"proxy"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "ROOT_CA") {
		t.Errorf("run(proxy) in shared mode without a root certificate = %v, want an error naming it", err)
	}
	t.Setenv("RUST_LOG", "info,access=loud")
	if err := run([]string{"proxy"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.HasPrefix(err.Error(), "RUST_LOG: ") {
		t.Errorf("run(proxy) with a bad RUST_LOG = %v, want an error naming it", err)
	}
	t.Setenv("RUST_LOG", "info")
	t.Setenv("PROXY_MODE", "dedicated")
	t.Setenv("PROXY_WORKLOAD_INFO", "")
	if err := run([]string{"proxy"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "PROXY_WORKLOAD_INFO") {
		t.Errorf("run(proxy) without PROXY_WORKLOAD_INFO = %v, want an error naming it", err)
	}
}

// TestBenchMoved checks that the node binary no longer offers the
// benchmarks but says where they went, with exit status 2.
func TestBenchMoved(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"help"}, &out, &errOut); err != nil || strings.Contains(out.String(), "bench") {
		t.Errorf("run(help) = %v, %q; want the usage without bench", err, out.String())
	}
	err := run([]string{"bench", "--quick"}, &out, &errOut)
	if !errors.Is(err, errBenchMoved) || !strings.Contains(err.Error(), "go run ./cmd/gozt-bench") {
		t.Errorf("run(bench --quick) = %v, want %v", err, errBenchMoved)
	}
	if got := exitCode(err); got != 2 {
		t.Errorf("exitCode(%v) = %d, want 2", err, got)
	}
	if got := exitCode(errUsage); got != 1 {
		t.Errorf("exitCode(%v) = %d, want 1", errUsage, got)
	}
}

// TestLocalBadLogFormat: gozt local refuses a LOG_FORMAT gozt proxy
// refuses, with the variable's name, before it starts anything.
func TestLocalBadLogFormat(t *testing.T) {
	t.Setenv("LOG_FORMAT", "JSON")
	var out, errOut bytes.Buffer
	err := run([]string{"local"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "LOG_FORMAT") {
		t.Errorf("gozt local with LOG_FORMAT=JSON = %v, want an error naming LOG_FORMAT", err)
	}
}

func TestLocalBadConfig(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"local", "--config", "/nonexistent/mesh.yaml"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "mesh.yaml") {
		t.Errorf("gozt local with a missing config = %v, want an error naming the file", err)
	}
}
