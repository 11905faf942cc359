package hbone

import (
	"io"
	"net"
)

// Push delivery: a stream whose application has nothing else to do with the
// received bytes than write them to one destination (a relay writing to a
// TCP socket) hands that job to the stream with PushTo. No goroutine then
// waits on the stream while it is idle (DESIGN "Making HBONE fast": one
// goroutine per stream per proxy):
//
//   - The goroutine that makes bytes or the end of the stream available (the
//     connection's reader, or whoever resets or closes the stream) writes them
//     to the destination at once, with one non-blocking attempt when the
//     destination has TryWrite.
//   - What the destination does not take at once stays in the stream's
//     buffer, and a short-lived drainer goroutine writes it with blocking
//     writes, then exits when the buffer is empty.
//   - Stream window credit is returned only when bytes reach the destination,
//     so a destination that stops reading holds at most the stream window and
//     never stalls the connection's reader.

// tryWriter is a destination that can take bytes without blocking.
type tryWriter interface {
	// TryWrite writes as much of p as the destination takes at once without
	// blocking, possibly nothing, and returns how much that was.
	TryWrite(p []byte) (int, error)
}

// pushState is the delivery state of a stream after PushTo. Its fields below
// the first three are guarded by stream.mu.
type pushState struct {
	w    io.Writer
	tw   tryWriter // w's TryWrite, or nil: every write goes to a drainer
	done func(error)

	// busy is set while one goroutine (the one that found work, or the
	// drainer) owns the writes to w. Only the owner writes, so bytes keep
	// their order and w sees one writer at a time.
	busy  bool
	ended bool // done was called or is being called
}

// PushTo hands the stream's received bytes to w: from now on they are written
// to w as they arrive, without a goroutine waiting on the stream, until the
// stream's read side ends. Then done is called exactly once, with nil after
// the peer's END_STREAM (or a reset with NO_ERROR or CANCEL) once every byte
// was written, or with the error that ended delivery: the error a Read would
// have returned, net.ErrClosed after Close, or w's write error.
//
// If w has a method TryWrite(p []byte) (int, error) that writes without
// blocking, bytes are first offered to it from whichever goroutine made them
// available (usually the connection's reader, which must never block); only
// what it does not take goes to a short-lived goroutine that calls w.Write.
// w's methods are called from one goroutine at a time. done is called without
// locks held, from any of these goroutines or from Close; it must not block.
//
// After PushTo, Read and WriteTo fail. Deadlines do not apply to pushed
// bytes. The application must still Close the stream.
func (s *stream) PushTo(w io.Writer, done func(error)) error {
	ps := &pushState{w: w, done: done}
	ps.tw, _ = w.(tryWriter)
	s.mu.Lock()
	switch {
	case s.push != nil:
		s.mu.Unlock()
		return errPushing
	case s.flags&fClosed != 0:
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.push = ps
	run := s.pushReadyLocked()
	s.mu.Unlock()
	if run {
		s.pushOut(false)
	}
	return nil
}

// pushReadyLocked reports whether the stream has pushed delivery with work
// to do (bytes, or the end of the read side) and nobody doing it; if so the
// caller now owns delivery and must call pushOut after unlocking s.mu.
func (s *stream) pushReadyLocked() bool {
	ps := s.push
	if ps == nil || ps.busy || ps.ended {
		return false
	}
	if s.buf.Len() == 0 && s.rerr == nil && s.flags&fClosed == 0 {
		return false
	}
	ps.busy = true
	return true
}

// pushOut writes buffered bytes to the push destination until the buffer is
// empty, then ends delivery if the read side has ended. The caller owns
// delivery (pushState.busy). With block false it makes non-blocking attempts
// only, and hands what is left to a new drainer goroutine.
func (s *stream) pushOut(block bool) {
	ps := s.push
	for {
		s.mu.Lock()
		var err error
		switch {
		case s.flags&fClosed != 0:
			err = net.ErrClosed
		case s.buf.Len() > 0:
		case s.rerr != nil:
			err = s.rerr
		default:
			// Everything was written and the stream goes on: idle.
			ps.busy = false
			s.mu.Unlock()
			return
		}
		if err != nil {
			s.endPushLocked(err)
			return
		}
		if !block && ps.tw == nil {
			s.mu.Unlock()
			go s.drainPush()
			return
		}
		// Detach the chunk while writing it, so that Close cannot return
		// it to its pool under the write.
		ch := s.buf.popChunk()
		s.mu.Unlock()

		var n int
		var werr error
		if block {
			n, werr = ps.w.Write(ch.b[ch.r:ch.w])
		} else {
			n, werr = ps.tw.TryWrite(ch.b[ch.r:ch.w])
		}
		size := ch.w - ch.r
		n = max(0, min(n, size))
		if block && n < size && werr == nil {
			werr = io.ErrShortWrite // io.Writer forbids this; do not spin on it
		}

		s.mu.Lock()
		ch.r += n
		consumed := n
		if s.flags&fClosed != 0 || werr != nil {
			// The bytes not written are dropped with the stream (Close
			// discarded the rest) or will be (the caller closes after a
			// write error); either way they count as consumed now.
			putChunk(ch.b)
			consumed = size
		} else if ch.r < ch.w {
			s.buf.pushFront(ch)
		} else {
			putChunk(ch.b)
		}
		if werr != nil {
			s.consumedLocked(consumed)
			s.mu.Lock()
			s.endPushLocked(werr)
			return
		}
		s.consumedLocked(consumed) // unlocks
		if n < size && !block {
			// The destination is full: a drainer waits for it.
			go s.drainPush()
			return
		}
	}
}

// drainPush is the short-lived goroutine that writes what a non-blocking
// attempt could not, blocking on the destination, and exits once the buffer
// is empty (or the read side ended).
func (s *stream) drainPush() {
	s.pushOut(true)
}

// endPushLocked ends pushed delivery with err (io.EOF reads as a clean end)
// and calls done after unlocking s.mu.
func (s *stream) endPushLocked(err error) {
	ps := s.push
	ps.ended = true
	ps.busy = false
	s.mu.Unlock()
	if err == io.EOF {
		err = nil
	}
	ps.done(err)
}
