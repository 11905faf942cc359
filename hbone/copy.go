package hbone

import (
	"io"
	"net"
	"os"
	"sync"
)

// WriteTo writes the stream's bytes to w until EOF (io.Copy and
// io.CopyBuffer use it). Received chunks go to w directly, without a copy
// through an intermediate buffer, and window credit is returned only once w
// took them: a slow w holds at most the stream window.
func (s *stream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		b, err := s.takeChunk()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		n, werr := w.Write(b.b[b.r:b.w])
		total += int64(n)
		putChunk(b.b)
		s.mu.Lock()
		s.consumedLocked(b.w - b.r)
		if werr != nil {
			return total, werr
		}
	}
}

// takeChunk waits for received bytes and detaches the first chunk from the
// buffer. Its bytes are accounted as consumed by the caller once written.
func (s *stream) takeChunk() (chunk, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.push != nil {
		return chunk{}, errPushing
	}
	for s.buf.Len() == 0 {
		if s.flags&fClosed != 0 {
			return chunk{}, net.ErrClosed
		}
		if s.rerr != nil {
			return chunk{}, s.rerr
		}
		if s.dl != nil && s.dl.read.expired {
			return chunk{}, os.ErrDeadlineExceeded
		}
		ch := s.waitChanLocked()
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	return s.buf.popChunk(), nil
}

// Copy buffer size classes for ReadFrom, grown with the flow like ztunnel's
// copy loop (SPEC §2.8): 1 KiB, 16 KiB after 128 KiB, 256 KiB after 10 MiB.
var (
	copyPool16k  = sync.Pool{New: func() any { return new([16 << 10]byte) }}
	copyPool256k = sync.Pool{New: func() any { return new([256 << 10]byte) }}
)

// ReadFrom sends what it reads from r until EOF (io.Copy uses it when
// copying into the stream). It does not end the write direction; call
// CloseWrite for that.
func (s *stream) ReadFrom(r io.Reader) (int64, error) {
	var small [1 << 10]byte
	buf := small[:]
	var big16 *[16 << 10]byte
	var big256 *[256 << 10]byte
	defer func() {
		if big16 != nil {
			copyPool16k.Put(big16)
		}
		if big256 != nil {
			copyPool256k.Put(big256)
		}
	}()
	var total int64
	for {
		switch {
		case total >= 10<<20 && big256 == nil:
			big256 = copyPool256k.Get().(*[256 << 10]byte)
			buf = big256[:]
		case total >= 128<<10 && big16 == nil && big256 == nil:
			big16 = copyPool16k.Get().(*[16 << 10]byte)
			buf = big16[:]
		}
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
