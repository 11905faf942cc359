// Package tcptest serves TCP for tests: an accept loop that runs a handler
// per connection and, when the test ends, closes its listener and waits for
// every handler, and an echo server built on it. Only tests import it.
package tcptest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Serve runs handle on its own goroutine for every connection ln accepts
// and closes the connection when handle returns. When the test ends it
// closes ln and waits for the accept loop and every handler, so a handler
// must return once its peer has gone.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
}

// Echo listens on addr (host:port, port 0 for any) and echoes every
// connection until it ends, until the test ends. It returns the address
// it listens on.
func Echo(t testing.TB, addr string) net.Addr {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	Serve(t, ln, func(c net.Conn) { io.Copy(c, c) })
	return ln.Addr()
}
