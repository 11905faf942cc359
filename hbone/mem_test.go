package hbone

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestIdleStreamMemory measures the heap held per idle tunnel (both ends,
// excluding goroutine stacks) and checks it against a budget.
func TestIdleStreamMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("memory measurement")
	}
	release := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		s.Close()
	}, pairOpts{srv: Config{MaxConcurrentStreams: 2000}, cli: Config{MaxConcurrentStreams: 2000}})
	defer close(release)
	const n = 1000
	streams := make([]*ClientStream, 0, n)
	// Warm up pools and maps.
	for range 10 {
		s := p.connect(context.Background())
		s.Write([]byte("x"))
		streams = append(streams, s)
	}
	heapPerItem(t, "idle tunnel", n, 4<<10, func() {
		streams = append(streams, p.connect(context.Background()))
	})
	for _, s := range streams {
		s.Close()
	}
}

// TestConnBufferedBoundedByWindow (issue 14 defect 6): streams whose
// destination never reads hold at most the connection window in total:
// connection credit returns only as bytes are read, so the client's
// writes past that window wait instead of piling up in the server.
func TestConnBufferedBoundedByWindow(t *testing.T) {
	const streamWin, connWin, n = 64 << 10, 256 << 10, 8
	release := make(chan struct{})
	read := make(chan int64, n)
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		<-release
		m, _ := io.Copy(io.Discard, s)
		read <- m
		s.Close()
	}, pairOpts{srv: Config{StreamWindow: streamWin, ConnWindow: connWin}})
	var done atomic.Int32
	errs := make(chan error, n)
	for range n {
		s := p.connect(context.Background())
		go func() {
			_, err := s.Write(make([]byte, streamWin))
			done.Add(1)
			if err == nil {
				err = s.CloseWrite()
			}
			errs <- err
		}()
	}
	// Wait until the writes that fit have gone through and the rest stall.
	var last int32 = -1
	for stable := 0; stable < 5; time.Sleep(50 * time.Millisecond) {
		if d := done.Load(); d == last {
			stable++
		} else {
			last, stable = d, 0
		}
	}
	if got, most := done.Load(), int32(connWin/streamWin); got > most {
		t.Errorf("%d of %d writes of %d KiB completed toward streams that do not read, want at most %d (connection window %d KiB)",
			got, n, streamWin>>10, most, connWin>>10)
	}
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("write after the handlers read: %v", err)
		}
		if m := <-read; m != streamWin {
			t.Errorf("handler read %d bytes, want %d", m, streamWin)
		}
	}
}

// TestLargeHeaderBlockNotPinned (issue 14 defect 6): after a large header
// block, in one frame or in many, an idle connection gives the block's
// buffers back: the frame reader's and the HPACK decoder's would otherwise
// stay as large as the block for the connection's life.
func TestLargeHeaderBlockNotPinned(t *testing.T) {
	if testing.Short() {
		t.Skip("memory measurement")
	}
	big := strings.Repeat("v", 60<<10)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "CONNECT"}, {":authority", "10.0.0.1:80"}, {"x-big", big}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	for _, tc := range []struct {
		name  string
		frame int // bytes of the block per frame
	}{{"one frame", len(block)}, {"16 KiB frames", 16 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			var frames bytes.Buffer
			fr := http2.NewFramer(&frames, nil)
			fr.WriteSettingsAck()
			first := block[:min(tc.frame, len(block))]
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(first) == len(block)})
			for rest := block[len(first):]; len(rest) > 0; {
				n := min(tc.frame, len(rest))
				fr.WriteContinuation(1, n == len(rest), rest[:n])
				rest = rest[n:]
			}
			const n = 20
			answered := make(chan struct{}, n)
			srv := &Server{Handler: func(s *ServerStream) {
				s.Respond(http.StatusBadRequest, nil)
				answered <- struct{}{}
			}}
			defer srv.Close()
			conns := make([]net.Conn, n)
			for i := range conns {
				cn, sn := connPair(t, false)
				go srv.ServeConn(context.Background(), sn)
				conns[i] = cn
				io.WriteString(cn, http2.ClientPreface)
				http2.NewFramer(cn, nil).WriteSettings()
				go func() { // read and drop what the server sends, with a small buffer
					b := make([]byte, 512)
					for {
						if _, err := cn.Read(b); err != nil {
							return
						}
					}
				}()
			}
			time.Sleep(100 * time.Millisecond) // the handshakes settle
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for _, cn := range conns {
				if _, err := cn.Write(frames.Bytes()); err != nil {
					t.Fatal(err)
				}
			}
			for range n {
				select {
				case <-answered:
				case <-time.After(10 * time.Second):
					t.Fatal("a large CONNECT was not answered")
				}
			}
			// The answers are written and the streams go away soon after
			// the handlers return: measure until the heap settles.
			var per int64
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				runtime.GC()
				runtime.ReadMemStats(&after)
				per = (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
				if per <= 16<<10 || time.Now().After(deadline) {
					break
				}
			}
			t.Logf("heap kept per idle connection after a %d KiB header block: %d bytes", len(block)>>10, per)
			if per > 16<<10 {
				t.Errorf("an idle connection keeps %d bytes after a %d KiB header block, budget 16 KiB", per, len(block)>>10)
			}
			for _, cn := range conns {
				cn.Close()
			}
		})
	}
}

// TestHPACKStateAfterLargeBlock: letting go of a large block's buffers
// leaves the HPACK decoder in step with the peer's encoder: a later block
// that refers to dynamic-table entries the large one added still decodes.
func TestHPACKStateAfterLargeBlock(t *testing.T) {
	seen := make(chan string, 2)
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		seen <- s.Header().Get("x-small")
		s.Respond(http.StatusOK, nil)
		s.Close()
	}})
	r.Handshake()
	big := strings.Repeat("v", 40<<10)
	r.Connect(1, rawTarget, "x-small", "first", "x-big", big)
	r.Connect(3, rawTarget, "x-small", "first") // indexed from the dynamic table now
	for i := range 2 {
		select {
		case got := <-seen:
			if got != "first" {
				t.Errorf("request %d: x-small = %q, want %q", i, got, "first")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d never reached the handler", i)
		}
	}
}

// TestIdleConnMemory measures the heap an idle HBONE connection holds (both
// ends, after one small exchange, excluding goroutine stacks) and checks it
// against a budget. A pooled connection carries up to 100 idle streams, so
// each KiB here is about 10 bytes per idle tunnel. About 16 KiB in all now;
// 25–28 KiB while each end kept a 4 KiB scratch buffer for small DATA, and
// 49–51 KiB while its read buffer was 16 KiB (readBufSize).
func TestIdleConnMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("memory measurement")
	}
	const n = 50
	echo := func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		io.Copy(s, s)
		s.Close()
	}
	open := func() *testPair {
		p := newPair(t, echo, pairOpts{})
		s := p.connect(context.Background())
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		s.Close()
		return p
	}
	pairs := []*testPair{open(), open()} // warm up pools
	heapPerItem(t, "idle connection", n, 22<<10, func() { pairs = append(pairs, open()) })
	runtime.KeepAlive(pairs)
}

// heapPerItem calls add n times and fails t if the live heap grew by more
// than budget bytes per call (client and server ends together, goroutine
// stacks not counted).
func heapPerItem(t *testing.T, what string, n int, budget int64, add func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		add()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(n)
	t.Logf("heap per %s (client + server, no stacks): %d bytes", what, per)
	if per > budget {
		t.Errorf("%s holds %d bytes of heap, budget %d KiB", what, per, budget>>10)
	}
}
