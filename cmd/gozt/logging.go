package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/grpclog"

	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
)

// newLogger returns the process's logger: format (LOG_FORMAT) on w, passed
// on by levels. It also takes over the lines the process would otherwise
// write around it, so that with LOG_FORMAT=json every line is a JSON object
// (TestJSONLogsOnly): the standard library's log package (net/http's
// server errors, say) and gRPC's logger (the xDS and CA clients) go
// through it too.
func newLogger(w io.Writer, format string, levels *logscope.Levels) *slog.Logger {
	logger := logscope.NewLogger(w, format, levels)
	slog.SetDefault(logger) // log.Printf → logger, at info
	grpclog.SetLoggerV2(newGRPCLogger(logger.With("scope", "grpc"), os.Getenv))
	return logger
}

// printError writes the error gozt exits with to w: a JSON log record when
// LOG_FORMAT is json, so that a pipeline parsing every line loses none,
// else "gozt: <err>".
func printError(w io.Writer, format string, err error) {
	if strings.EqualFold(format, logscope.FormatJSON) {
		logscope.NewLogger(w, format, logscope.NewLevels(logscope.Filter{})).Error(err.Error())
		return
	}
	fmt.Fprintln(w, "gozt:", err)
}

// grpcLogger is gRPC's logger (grpclog.LoggerV2) writing through gozt's. As
// gRPC's default logger does, it drops info and warning lines unless
// GRPC_GO_LOG_SEVERITY_LEVEL asks for them, and verbose ones above
// GRPC_GO_LOG_VERBOSITY_LEVEL.
type grpcLogger struct {
	log       *slog.Logger
	min       slog.Level
	verbosity int
}

var _ grpclog.LoggerV2 = grpcLogger{}

func newGRPCLogger(log *slog.Logger, getenv func(string) string) grpcLogger {
	g := grpcLogger{log: log, min: slog.LevelError}
	switch strings.ToLower(getenv("GRPC_GO_LOG_SEVERITY_LEVEL")) {
	case "info":
		g.min = slog.LevelInfo
	case "warning":
		g.min = slog.LevelWarn
	}
	g.verbosity, _ = strconv.Atoi(getenv("GRPC_GO_LOG_VERBOSITY_LEVEL"))
	return g
}

func (g grpcLogger) print(l slog.Level, msg string) {
	if l >= g.min {
		g.log.Log(context.Background(), l, strings.TrimSuffix(msg, "\n"))
	}
}

func (g grpcLogger) Info(args ...any) {
	g.print(slog.LevelInfo, fmt.Sprint(args...))
}

func (g grpcLogger) Infoln(args ...any) {
	g.print(slog.LevelInfo, fmt.Sprintln(args...))
}

func (g grpcLogger) Infof(format string, args ...any) {
	g.print(slog.LevelInfo, fmt.Sprintf(format, args...))
}

func (g grpcLogger) Warning(args ...any) {
	g.print(slog.LevelWarn, fmt.Sprint(args...))
}

func (g grpcLogger) Warningln(args ...any) {
	g.print(slog.LevelWarn, fmt.Sprintln(args...))
}

func (g grpcLogger) Warningf(format string, args ...any) {
	g.print(slog.LevelWarn, fmt.Sprintf(format, args...))
}

func (g grpcLogger) Error(args ...any) {
	g.print(slog.LevelError, fmt.Sprint(args...))
}

func (g grpcLogger) Errorln(args ...any) {
	g.print(slog.LevelError, fmt.Sprintln(args...))
}

func (g grpcLogger) Errorf(format string, args ...any) {
	g.print(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal, Fatalln and Fatalf log at error and exit 1, as gRPC's own logger
// does.
func (g grpcLogger) Fatal(args ...any) {
	g.fatal(fmt.Sprint(args...))
}

func (g grpcLogger) Fatalln(args ...any) {
	g.fatal(fmt.Sprintln(args...))
}

func (g grpcLogger) Fatalf(format string, args ...any) {
	g.fatal(fmt.Sprintf(format, args...))
}

func (g grpcLogger) fatal(msg string) {
	g.log.Error(strings.TrimSuffix(msg, "\n"))
	os.Exit(1)
}

// V reports whether verbosity level l is enabled (GRPC_GO_LOG_VERBOSITY_LEVEL).
func (g grpcLogger) V(l int) bool { return l <= g.verbosity }
