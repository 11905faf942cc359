package hbone

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
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

// BenchmarkMultiplexStalled (TESTPLAN L4): the throughput of 90 active
// streams on one connection beside 10 streams whose handler never reads,
// as a ratio of the same 90 streams' on a connection without them,
// measured alternately in the same run (metric "ratio", target ≥ 0.8).
// With every stream given its whole 4 MiB window at once the stalled
// streams hold the connection window and the ratio is 0 (a deadlock).
func BenchmarkMultiplexStalled(b *testing.B) {
	const stalled, active, perActive = 10, 90, 1 << 20
	release := make(chan struct{})
	handler := func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		if s.Header().Get("Mode") == "stall" {
			<-release
			return
		}
		io.Copy(io.Discard, s)
	}
	plain := newPair(b, handler, pairOpts{})
	crowded := newPair(b, handler, pairOpts{})
	defer close(release)
	for range stalled {
		s, err := crowded.cc.Connect(context.Background(), "10.0.0.1:80", http.Header{"Mode": {"stall"}})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		go s.Write(make([]byte, 4<<20)) // blocks once its window is spent; ends with the stream
	}
	buf := payload(1, 64<<10)
	run := func(p *testPair) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for range active {
			s := p.connect(context.Background())
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.Close()
				for sent := 0; sent < perActive; sent += len(buf) {
					if _, err := s.Write(buf); err != nil {
						b.Error(err)
						return
					}
				}
				s.CloseWrite()
				io.Copy(io.Discard, s)
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	run(crowded) // let the stalled streams spend their windows first
	var tPlain, tCrowded time.Duration
	b.SetBytes(2 * active * perActive)
	b.ResetTimer()
	for range b.N {
		tPlain += run(plain)
		tCrowded += run(crowded)
	}
	b.ReportMetric(tPlain.Seconds()/tCrowded.Seconds(), "ratio")
}
