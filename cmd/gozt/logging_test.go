package main

import (
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/grpclog"

	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/internal/syncbuf"
)

// TestLoggerTakesOverOtherLines: the logger gozt runs with also carries
// what the log package (net/http's server errors) and gRPC (the xDS and CA
// clients) write, so that with LOG_FORMAT=json those lines are JSON
// records too; gRPC's info and warning lines stay dropped by default, as
// with gRPC's own logger. The error gozt exits with is one as well.
func TestLoggerTakesOverOtherLines(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() {
		slog.SetDefault(prev)
		log.SetOutput(os.Stderr)
		log.SetFlags(log.LstdFlags)
		grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
	})
	var buf syncbuf.Buffer
	newLogger(&buf, "json", logscope.NewLevels(logscope.Filter{}))
	log.Printf("http: Accept error: %v; retrying in 5ms", errors.New("too many open files"))
	grpclog.Errorf("transport: received GOAWAY %q", "too_many_pings")
	grpclog.Infof("[core] dropped info")
	grpclog.Warningf("[core] dropped warning")
	printError(&buf, "json", errors.New("CA_ROOT_CA: bad"))
	want := []struct{ level, scope, message string }{
		{"info", "gozt", "http: Accept error: too many open files; retrying in 5ms"},
		{"error", "grpc", `transport: received GOAWAY "too_many_pings"`},
		{"error", "gozt", "CA_ROOT_CA: bad"},
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, line := range lines {
		var rec struct{ Level, Scope, Message string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("line %d is not JSON (%v): %q", i, err, line)
			continue
		}
		if rec.Level != want[i].level || rec.Scope != want[i].scope || rec.Message != want[i].message {
			t.Errorf("line %d = %+v, want %+v", i, rec, want[i])
		}
	}

	var plain strings.Builder
	printError(&plain, "plain", errors.New("CA_ROOT_CA: bad"))
	if got := plain.String(); got != "gozt: CA_ROOT_CA: bad\n" {
		t.Errorf("printError in plain format = %q, want the plain line", got)
	}
}
