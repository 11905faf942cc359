package hbone

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
)

// writeSizes records the size of every Write.
type writeSizes struct {
	bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.Buffer.Write(p)
}

// TestLargeDataWrittenInSegmentChunks: DATA frames larger than a chunk
// (the relay sends up to 262,080 bytes a frame) reach the destination in
// writes of at most largeChunkFill bytes, one loopback TCP segment, and
// whole.
func TestLargeDataWrittenInSegmentChunks(t *testing.T) {
	got := &writeSizes{}
	done := make(chan error, 1)
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		_, err := io.Copy(got, s) // WriteTo: one Write per chunk
		done <- err
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	want := payload(41, 4*262080+17)
	for b := want; len(b) > 0; {
		n := min(len(b), 262080)
		if _, err := s.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("destination got %d bytes, want %d (or content differs)", got.Len(), len(want))
	}
	largest := 0
	for _, n := range got.sizes {
		largest = max(largest, n)
	}
	if largest > largeChunkFill {
		t.Errorf("largest write to the destination %d bytes, want at most %d (one loopback segment)", largest, largeChunkFill)
	}
	if largest < largeChunkFill/2 {
		t.Errorf("largest write to the destination %d bytes: large frames were cut into small chunks", largest)
	}
}
