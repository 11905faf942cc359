package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Logs writes the tail (lines lines) of every host component's log, of
// every container log in the cluster, and the cluster's events, for a
// failed run.
func (c *Config) Logs(ctx context.Context, w io.Writer, lines int) {
	hostLogs, _ := filepath.Glob(filepath.Join(c.LogDir(), "*.log"))
	var podLogs []string
	filepath.WalkDir(podLogDir(), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.HasSuffix(p, ".log") {
			podLogs = append(podLogs, p)
		}
		return nil
	})
	slices.Sort(podLogs)
	for _, f := range append(hostLogs, podLogs...) {
		fmt.Fprintf(w, "\n===== %s (last %d lines) =====\n", f, lines)
		w.Write(tail(f, lines))
	}
	fmt.Fprintf(w, "\n===== events =====\n")
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", filepath.Join(pkiDir(), "admin.kubeconfig")}, args...)...)
		cmd.Stdout, cmd.Stderr = w, w
		cmd.Run()
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return []byte(err.Error() + "\n")
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines) > n+1 {
		lines = lines[len(lines)-n-1:]
	}
	return bytes.Join(lines, nil)
}
