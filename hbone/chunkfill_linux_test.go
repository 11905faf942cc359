package hbone

import (
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoopbackWriteSize writes 256 KiB a round over loopback TCP in
// writes of 64 KiB (what a received chunk was before largeChunkFill) and of
// largeChunkFill bytes, to a reader with a 256 KiB buffer, and reports
// the CPU of both ends per GB moved.
func BenchmarkLoopbackWriteSize(b *testing.B) {
	for _, size := range []int{64 << 10, largeChunkFill} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			cn, sn := connPair(b, false)
			defer cn.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				io.CopyBuffer(io.Discard, struct{ io.Reader }{sn}, make([]byte, 256<<10))
				sn.Close()
			}()
			buf := make([]byte, size)
			const round = 256 << 10
			b.SetBytes(round)
			start := processCPU()
			b.ResetTimer()
			for range b.N {
				for left := round; left > 0; left -= size {
					if _, err := cn.Write(buf[:min(size, left)]); err != nil {
						b.Fatal(err)
					}
				}
			}
			cn.(*net.TCPConn).CloseWrite()
			<-done
			b.StopTimer()
			b.ReportMetric((processCPU()-start).Seconds()/(float64(b.N)*round/1e9), "CPU-s/GB")
		})
	}
}
