package hbone

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// BenchmarkStreamThroughput measures one tunnel's throughput over loopback
// TCP: the client writes 256 KiB chunks, the server reads and discards them.
func BenchmarkStreamThroughput(b *testing.B) {
	const chunk = 256 << 10
	done := make(chan int64, 1)
	p := newPair(b, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		n, _ := io.Copy(io.Discard, s)
		done <- n
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	buf := payload(1, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	s.CloseWrite()
	if n := <-done; n != int64(b.N)*chunk {
		b.Fatalf("server read %d bytes, want %d", n, int64(b.N)*chunk)
	}
}

// BenchmarkStreamThroughputEcho measures bytes through an echoing tunnel, both
// directions at once.
func BenchmarkStreamThroughputEcho(b *testing.B) {
	const chunk = 256 << 10
	p := newPair(b, echoHandler, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	buf := payload(1, chunk)
	b.SetBytes(2 * chunk)
	b.ResetTimer()
	r := runAsync(func() error {
		_, err := io.Copy(io.Discard, s)
		return err
	})
	for range b.N {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	s.CloseWrite()
	if err := <-r; err != nil {
		b.Fatal(err)
	}
}
