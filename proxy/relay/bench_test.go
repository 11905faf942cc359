package relay_test

import (
	"io"
	"testing"
)

// BenchmarkCopyTCP measures one direction of a relay whose legs are both
// *net.TCPConn (the splice path), over loopback.
func BenchmarkCopyTCP(b *testing.B) { benchmarkCopy(b, legTCP) }

// BenchmarkCopyNonTCP measures the same with legs hidden behind a wrapper,
// so the relay uses its growing pooled buffers.
func BenchmarkCopyNonTCP(b *testing.B) { benchmarkCopy(b, legOpaque) }

func benchmarkCopy(b *testing.B, legs legKind) {
	const chunk = 1 << 20
	r := startRelay(b, legs, legs)
	drained := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, r.server)
		drained <- n
	}()
	buf := make([]byte, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := r.client.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	r.clientTCP.CloseWrite()
	if n := <-drained; n != int64(b.N)*chunk {
		b.Fatalf("server read %d bytes, want %d", n, int64(b.N)*chunk)
	}
	b.StopTimer()
}
