package relay_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// readAsync runs a waiting r.Read on a goroutine and returns its result.
func readAsync(r interface {
	Read(wait bool) ([]byte, error)
}) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		b, err := r.Read(true)
		ch <- readResult{b, err}
	}()
	return ch
}

type readResult struct {
	b   []byte
	err error
}

// TestSockReader checks the reads that let an idle direction wait without a
// buffer: bytes queued before the read are taken at once (the first read
// happens before any parking), a waiting read lasts until bytes arrive, one
// that may not wait returns ErrWouldBlock at once, the peer's FIN is io.EOF
// and a reset is reported as the error.
func TestSockReader(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		if _, err := peer.Write([]byte("xy")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let the bytes land
		r := relay.NewSockReaderForTest(c)
		b, err := r.Read(false)
		if err != nil || string(b) != "xy" {
			t.Fatalf("read with queued bytes = %q, %v; want \"xy\"", b, err)
		}
		if b, err := r.Read(false); err != relay.ErrWouldBlock || b != nil {
			t.Fatalf("read of a drained socket without waiting = %q, %v; want ErrWouldBlock", b, err)
		}
	})
	t.Run("blocks until data", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		done := readAsync(relay.NewSockReaderForTest(c))
		select {
		case got := <-done:
			t.Fatalf("read returned %q, %v with nothing to read", got.b, got.err)
		case <-time.After(100 * time.Millisecond):
		}
		peer.Write([]byte("y"))
		select {
		case got := <-done:
			if got.err != nil || string(got.b) != "y" {
				t.Fatalf("read = %q, %v; want \"y\"", got.b, got.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("read did not return when a byte arrived")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if got := <-readAsync(relay.NewSockReaderForTest(c)); !errors.Is(got.err, os.ErrDeadlineExceeded) {
			t.Fatalf("read past the deadline = %q, %v; want a deadline error", got.b, got.err)
		}
	})
	t.Run("fin", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		done := readAsync(relay.NewSockReaderForTest(c))
		peer.CloseWrite()
		if got := <-done; got.err != io.EOF || got.b != nil {
			t.Fatalf("read after FIN = %q, %v; want EOF", got.b, got.err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer c.Close()
		done := readAsync(relay.NewSockReaderForTest(c))
		peer.SetLinger(0)
		peer.Close()
		got := <-done
		if !errors.Is(got.err, syscall.ECONNRESET) || !relay.IsBenign(got.err) {
			t.Fatalf("read after a reset = %v, want ECONNRESET", got.err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		done := readAsync(relay.NewSockReaderForTest(c))
		time.Sleep(20 * time.Millisecond)
		c.Close()
		if got := <-done; got.err == nil || !relay.IsBenign(got.err) {
			t.Fatalf("read on a conn closed under it = %v, want a use-of-closed error", got.err)
		}
	})
}

// TestSockReaderNoAllocs: a read that finds nothing and a TryWrite allocate
// nothing, so an idle connection costs no garbage per wake-up and a push
// none per write.
func TestSockReaderNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	peer, c := tcpConnPair(t)
	defer peer.Close()
	defer c.Close()
	r := relay.NewSockReaderForTest(c)
	if n := testing.AllocsPerRun(100, func() { r.Read(false) }); n != 0 {
		t.Errorf("a read of an empty socket allocates %v times per call, want 0", n)
	}
	sink, _ := relay.NewTCPSinkForTest(c)
	b := []byte("b")
	if n := testing.AllocsPerRun(100, func() { sink.TryWrite(b) }); n != 0 {
		t.Errorf("TryWrite allocates %v times per call, want 0", n)
	}
}

// TestTCPSinkTryWrite: TryWrite never blocks: against a peer that does not
// read it takes what the socket holds, then nothing, with no error; what it
// reported is exactly what the peer reads; and it reports a reset peer.
func TestTCPSinkTryWrite(t *testing.T) {
	peer, c := tcpConnPair(t)
	defer peer.Close()
	defer c.Close()
	sink, counted := relay.NewTCPSinkForTest(c)
	p := bytes.Repeat([]byte("0123456789abcdef"), 4<<20) // 64 MiB: more than any socket buffer
	start := time.Now()
	var total int
	for range 4 {
		n, err := sink.TryWrite(p[total:])
		if err != nil {
			t.Fatalf("TryWrite = %d, %v", n, err)
		}
		total += n
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("four TryWrites to a full socket took %v", d)
	}
	if total == 0 || total == len(p) {
		t.Fatalf("TryWrite took %d of %d bytes; want a part", total, len(p))
	}
	if n, err := sink.TryWrite(p[total:]); n != 0 || err != nil {
		t.Errorf("TryWrite to a full socket = %d, %v; want 0, nil", n, err)
	}
	if got := counted(); got != int64(total) {
		t.Errorf("counted %d bytes, want %d", got, total)
	}
	got := make([]byte, total)
	peer.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	if !bytes.Equal(got, p[:total]) {
		t.Fatal("peer read other bytes than TryWrite reported")
	}

	peer.SetLinger(0)
	peer.Close()
	time.Sleep(20 * time.Millisecond)
	var err error
	for range 3 { // the first write after a reset may still succeed
		if _, err = sink.TryWrite([]byte("after reset")); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !relay.IsBenign(err) || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		t.Errorf("TryWrite to a reset peer = %v, want ECONNRESET or EPIPE", err)
	}
}

// TestResetAtEOF: a socket whose peer only sent its FIN (CLOSE_WAIT) is not
// taken for reset, one whose peer reset it (CLOSED) is, and asking costs no
// allocation.
func TestResetAtEOF(t *testing.T) {
	peer, c := tcpConnPair(t)
	defer c.Close()
	peer.CloseWrite()
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after FIN = %v, want EOF", err)
	}
	if relay.ResetAtEOF(c) {
		t.Error("ResetAtEOF after a FIN = true, want false")
	}
	if !raceEnabled {
		if n := testing.AllocsPerRun(100, func() { relay.ResetAtEOF(c) }); n != 0 {
			t.Errorf("ResetAtEOF allocates %v times per call, want 0", n)
		}
	}
	peer.SetLinger(0)
	peer.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !relay.ResetAtEOF(c) {
		if time.Now().After(deadline) {
			t.Fatal("ResetAtEOF after the peer's reset stayed false")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
