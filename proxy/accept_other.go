//go:build !linux

package proxy

import "net"

// shedQueued resets nothing off Linux, where gozt runs only for development: an
// accept loop out of descriptors backs off until one is freed.
func (g *acceptGuard) shedQueued(l net.Listener) int { return 0 }
