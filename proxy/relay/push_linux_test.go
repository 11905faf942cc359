package relay_test

import (
	"bytes"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// waitAsync runs w.Wait on a goroutine and returns its result channel.
func waitAsync(w interface{ Wait() error }) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- w.Wait() }()
	return ch
}

// TestReadWaiter checks the readability wait that lets an idle direction
// hold no buffer: bytes queued before the wait are seen at once (the first
// look happens before any parking), a wait lasts until bytes arrive, the
// peer's FIN counts as readable, and a reset is reported as the error
// rather than left for the next read to miss.
func TestReadWaiter(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		if _, err := peer.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let the byte land
		w := relay.NewReadWaiterForTest(c)
		select {
		case err := <-waitAsync(w):
			if err != nil {
				t.Fatalf("wait with a queued byte = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("wait did not see a byte queued before it started")
		}
		// The byte is still there for the read.
		var b [1]byte
		if n, err := c.Read(b[:]); n != 1 || b[0] != 'x' {
			t.Errorf("read after wait = %d, %v (%q); want the queued byte", n, err, b[:n])
		}
	})
	t.Run("blocks until data", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		done := waitAsync(relay.NewReadWaiterForTest(c))
		select {
		case err := <-done:
			t.Fatalf("wait returned %v with nothing to read", err)
		case <-time.After(100 * time.Millisecond):
		}
		peer.Write([]byte("y"))
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("wait = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("wait did not return when a byte arrived")
		}
	})
	t.Run("fin", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		defer c.Close()
		done := waitAsync(relay.NewReadWaiterForTest(c))
		peer.CloseWrite()
		if err := <-done; err != nil {
			t.Fatalf("wait after FIN = %v, want nil (readable: EOF)", err)
		}
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("read after FIN = %v, want EOF", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer c.Close()
		done := waitAsync(relay.NewReadWaiterForTest(c))
		peer.SetLinger(0)
		peer.Close()
		err := <-done
		if !errors.Is(err, syscall.ECONNRESET) || !relay.IsBenign(err) {
			t.Fatalf("wait after a reset = %v, want ECONNRESET", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		peer, c := tcpConnPair(t)
		defer peer.Close()
		done := waitAsync(relay.NewReadWaiterForTest(c))
		time.Sleep(20 * time.Millisecond)
		c.Close()
		if err := <-done; err == nil || !relay.IsBenign(err) {
			t.Fatalf("wait on a conn closed under it = %v, want a use-of-closed error", err)
		}
	})
}

// TestReadWaiterNoAllocs: waiting and TryWrite allocate nothing, so an idle
// connection costs no garbage per wake-up and a push none per write.
func TestReadWaiterNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	peer, c := tcpConnPair(t)
	defer peer.Close()
	defer c.Close()
	peer.Write([]byte("z")) // stays queued: every wait returns at once
	time.Sleep(20 * time.Millisecond)
	w := relay.NewReadWaiterForTest(c)
	if n := testing.AllocsPerRun(100, func() { w.Wait() }); n != 0 {
		t.Errorf("wait allocates %v times per call, want 0", n)
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
