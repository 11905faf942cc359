//go:build !linux

package bench

// children is Linux-only; elsewhere no child processes are reported.
func children() []int { return nil }
