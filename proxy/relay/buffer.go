package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Buffer size classes for directions that cannot splice (SPEC §2.8). A
// direction starts with a small buffer so that idle and short connections
// cost little, and moves up a class once it has carried enough bytes to show
// it is a bulk flow: a fixed 16 KiB buffer cost 18% of bulk throughput
// against 256 KiB in the prototype (DESIGN "Making HBONE fast").
//
// The sizes follow ztunnel's src/copy.rs: 16 KiB and 256 KiB less 64 bytes,
// so that a buffer plus the allocator's and TLS's bookkeeping stays within
// the power of two.
const (
	smallSize  = 1024
	mediumSize = 16320
	largeSize  = 262080

	mediumAfter = 128 << 10 // bytes moved before the medium buffer is used
	largeAfter  = 10 << 20  // bytes moved before the large buffer is used
)

// Buffer pools, one per size class. They hold pointers to arrays, so that Put
// stores a pointer in the interface without allocating (as x/net's
// http2/databuffer.go does). Package-level pools are shared caches with no
// observable state, the one kind of package-level variable STYLE 29 allows.
var (
	smallPool  = sync.Pool{New: func() any { return new([smallSize]byte) }}
	mediumPool = sync.Pool{New: func() any { return new([mediumSize]byte) }}
	largePool  = sync.Pool{New: func() any { return new([largeSize]byte) }}
)

// bufferSize returns the size of the read buffer a direction uses after it
// has moved the given number of bytes.
func bufferSize(moved int64) int {
	switch {
	case moved >= largeAfter:
		return largeSize
	case moved >= mediumAfter:
		return mediumSize
	default:
		return smallSize
	}
}

// getBuffer returns a pooled buffer of one of the class sizes.
func getBuffer(size int) []byte {
	switch size {
	case largeSize:
		return largePool.Get().(*[largeSize]byte)[:]
	case mediumSize:
		return mediumPool.Get().(*[mediumSize]byte)[:]
	default:
		return smallPool.Get().(*[smallSize]byte)[:]
	}
}

// putBuffer returns a buffer from getBuffer to its pool. b must be the whole
// slice getBuffer returned.
func putBuffer(b []byte) {
	switch len(b) {
	case largeSize:
		largePool.Put((*[largeSize]byte)(b))
	case mediumSize:
		mediumPool.Put((*[mediumSize]byte)(b))
	case smallSize:
		smallPool.Put((*[smallSize]byte)(b))
	}
}

// copyBuffered copies h.src to h.dst through pooled buffers that grow with
// the bytes moved. It returns nil when h.src reaches EOF.
//
// A *net.TCPConn source is read through a sockReader, so an idle direction
// waits without a buffer. Other sources are read with a buffer in hand.
func (h *half) copyBuffered() error {
	var r *sockReader
	if tcp, ok := h.src().(*net.TCPConn); ok {
		r = newSockReader(tcp)
	}
	for {
		var err error
		if r == nil {
			_, err = h.copyChunk()
		} else {
			var buf []byte
			var n int
			if buf, n, err = h.readSocket(r, true); err == nil {
				err = h.writeChunk(buf, n)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// readSocket reads h.src through r (see sockReader.read) into a buffer of
// h's current size class. io.EOF and errWouldBlock come back as they are,
// other errors wrapped with the operation.
func (h *half) readSocket(r *sockReader, wait bool) ([]byte, int, error) {
	buf, n, err := r.read(bufferSize(h.n), wait)
	if err != nil && err != io.EOF && err != errWouldBlock {
		err = readError(err)
	}
	return buf, n, err
}

// writeChunk writes the n bytes a read left in buf to h.dst, counts them and
// puts buf back in its pool.
//
//go:noinline
func (h *half) writeChunk(buf []byte, n int) error {
	nw, err := writeFull(h.dst(), buf[:n])
	putBuffer(buf)
	h.add(int64(nw))
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// copyChunk makes one read from h.src into a pooled buffer of the current
// size class and writes what it got to h.dst. It reports whether the read
// filled the buffer, and returns io.EOF as it is and other errors wrapped
// with the operation.
//
//go:noinline
func (h *half) copyChunk() (full bool, err error) {
	buf := getBuffer(bufferSize(h.n))
	defer putBuffer(buf)
	nr, rerr := h.src().Read(buf)
	if nr > 0 {
		nw, werr := writeFull(h.dst(), buf[:nr])
		h.add(int64(nw))
		if werr != nil {
			return false, fmt.Errorf("write: %w", werr)
		}
	}
	if rerr != nil && rerr != io.EOF {
		return false, readError(rerr)
	}
	return nr == len(buf), rerr
}

// readError wraps a read failure with the operation.
//
//go:noinline
func readError(err error) error {
	return fmt.Errorf("read: %w", err)
}

// errInvalidWrite means a Write reported more bytes than it was given.
var errInvalidWrite = errors.New("invalid write result")

// writeFull writes all of p to w, calling Write again after a short write
// that came without an error (which io.Writer forbids, but wrappers do). A
// Write that makes no progress and reports no error ends with
// io.ErrShortWrite rather than spinning.
func writeFull(w io.Writer, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := w.Write(p[n:])
		if m < 0 || m > len(p)-n {
			return n, errInvalidWrite
		}
		n += m
		if err != nil {
			return n, err
		}
		if m == 0 {
			return n, io.ErrShortWrite
		}
	}
	return n, nil
}
