//go:build !linux

package bench

import (
	"context"
	"fmt"
)

// runNode skips the node scenario: it needs Linux network namespaces.
func runNode(_ context.Context, e *env) ([]Result, error) {
	msg := "node: skipped, " + errNotLinux.Error()
	fmt.Fprintln(e.stderr, msg)
	e.notes = append(e.notes, msg)
	return nil, nil
}

// netnsExecFlag is Run's first argument for execInNetns.
const netnsExecFlag = "--netns-exec"

func execInNetns([]string) error { return errNotLinux }

func startBare(context.Context, []string) (role, error) { return nil, errNotLinux }
