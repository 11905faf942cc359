package relay_test

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/proxy/relay"
)

// TestBufferSize pins the growth thresholds of SPEC §2.8.
func TestBufferSize(t *testing.T) {
	for _, tc := range []struct {
		moved int64
		want  int
	}{
		{0, 1024},
		{128<<10 - 1, 1024},
		{128 << 10, 16320},
		{10<<20 - 1, 16320},
		{10 << 20, 262080},
		{1 << 40, 262080},
	} {
		if got := relay.BufferSize(tc.moved); got != tc.want {
			t.Errorf("bufferSize(%d) = %d, want %d", tc.moved, got, tc.want)
		}
	}
}

// TestBufferGrowth checks that a non-TCP direction really reads with the
// buffer of its class: it records the size of every Read the relay makes on
// a source that always fills the buffer.
func TestBufferGrowth(t *testing.T) {
	const total = 11 << 20
	src := &recordingConn{remaining: total}
	res, err := relay.Copy(src, &sinkConn{})
	if err != nil || res.AToB != total {
		t.Fatalf("Copy = %+v, %v; want AToB %d, nil", res, err, total)
	}
	var want []int
	for moved := int64(0); moved < total; {
		size := relay.BufferSize(moved)
		want = append(want, size)
		moved += int64(min(size, int(total-moved)))
	}
	want = append(want, relay.LargeSize) // the read that returns EOF
	if diff := cmp.Diff(want, src.reads); diff != "" {
		t.Errorf("read sizes (-want +got):\n%s", diff)
	}
	if !src.closed {
		t.Error("source without CloseWrite was not closed after both directions ended")
	}
}

// recordingConn is a net.Conn whose Read fills p until remaining runs out,
// recording len(p) each time; it has no CloseWrite.
type recordingConn struct {
	net.Conn  // nil: only the methods below are called
	remaining int
	reads     []int
	closed    bool
}

func (c *recordingConn) Read(p []byte) (int, error) {
	c.reads = append(c.reads, len(p))
	if c.remaining == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.remaining)
	c.remaining -= n
	return n, nil
}

// Write is called by the other direction, which carries nothing.
func (c *recordingConn) Write(p []byte) (int, error) { return len(p), nil }

func (c *recordingConn) Close() error { c.closed = true; return nil }

// sinkConn discards what is written and reads EOF at once.
type sinkConn struct{ net.Conn }

func (sinkConn) Read([]byte) (int, error)    { return 0, io.EOF }
func (sinkConn) Write(p []byte) (int, error) { return len(p), nil }
func (sinkConn) Close() error                { return nil }

// TestBufferPoolNoAlloc checks that taking and returning pooled buffers does
// not allocate once the pools are warm (pointers to arrays, STYLE 37).
func TestBufferPoolNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, size := range []int{relay.SmallSize, relay.MediumSize, relay.LargeSize} {
		relay.PutBuffer(relay.GetBuffer(size))
		allocs := testing.AllocsPerRun(100, func() {
			b := relay.GetBuffer(size)
			if len(b) != size {
				t.Fatalf("getBuffer(%d) has length %d", size, len(b))
			}
			relay.PutBuffer(b)
		})
		if allocs != 0 {
			t.Errorf("getBuffer/putBuffer(%d): %v allocs per run, want 0", size, allocs)
		}
	}
}

// shortWriter accepts at most max bytes per Write, with a nil error.
type shortWriter struct {
	max int
	got []byte
}

func (w *shortWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.max)
	w.got = append(w.got, p[:n]...)
	return n, nil
}

type badWriter struct{ n int }

func (w badWriter) Write([]byte) (int, error) { return w.n, nil }

func TestWriteFull(t *testing.T) {
	p := []byte("0123456789")
	w := &shortWriter{max: 3}
	if n, err := relay.WriteFull(w, p); n != len(p) || err != nil || string(w.got) != string(p) {
		t.Errorf("writeFull(short writer) = %d, %v, wrote %q; want %d, nil, %q", n, err, w.got, len(p), p)
	}
	if n, err := relay.WriteFull(&shortWriter{max: 0}, p); n != 0 || !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("writeFull(no progress) = %d, %v; want 0, io.ErrShortWrite", n, err)
	}
	if _, err := relay.WriteFull(badWriter{n: 11}, p); err == nil {
		t.Error("writeFull(writer reporting too much) = nil error")
	}
	if _, err := relay.WriteFull(badWriter{n: -1}, p); err == nil {
		t.Error("writeFull(writer reporting a negative count) = nil error")
	}
}
