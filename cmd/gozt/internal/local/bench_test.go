package local

import (
	"io"
	"net"
	"testing"

	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/internal/tcptest"
)

// BenchmarkHBONEThroughput pushes bytes client → SOCKS5 → outbound → HBONE
// → inbound → sink through a whole in-process mesh (b.SetBytes: MB/s).
// `gozt bench` compares this path with its baselines; this benchmark is for
// quick before/after checks of one change.
func BenchmarkHBONEThroughput(b *testing.B) {
	tm := startMeshWith(b, "")
	ln, err := net.Listen("tcp", tm.ips.Server+":8080")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		done <- n
	}()
	c := tm.socksDial(b, tm.ips.Server+":8080")
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	if n := <-done; n != int64(b.N)*int64(len(buf)) {
		b.Fatalf("sink got %d bytes, want %d", n, int64(b.N)*int64(len(buf)))
	}
	c.Close()
}

// BenchmarkConnect opens a connection through the in-process mesh, sends
// one byte, reads it back from an echo and closes, one at a time: the
// connect scenario of `gozt bench` without its processes. With
// -benchmem (or b.ReportAllocs, on here) it gives the heap both proxies,
// the client and the echo allocate per connection; with -memprofile
// -memprofilerate 1, where.
func BenchmarkConnect(b *testing.B) {
	// The binary's logger at its default level (RUST_LOG and LOG_FORMAT
	// unset), so each proxy's access line per connection is formatted as
	// in production, and discarded.
	levels := logscope.NewLevels(logscope.Filter{})
	tm := startMeshOpts(b, "", Options{Logger: logscope.NewLogger(io.Discard, logscope.FormatPlain, levels)})
	tcptest.Echo(b, tm.ips.Server+":8080")
	b.ReportAllocs()
	buf := make([]byte, 1)
	for b.Loop() {
		c := tm.socksDial(b, tm.ips.Server+":8080")
		if _, err := c.Write([]byte{'x'}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}
