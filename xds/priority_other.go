//go:build !linux

package xds

// runLowPriority runs fn; only Linux lowers the priority of one thread.
func runLowPriority(fn func()) { fn() }
