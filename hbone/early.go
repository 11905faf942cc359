package hbone

import (
	"errors"
	"io"
	"os"
	"time"
)

// EarlySource is where ConnectEarly takes a tunnel's first bytes from: the
// downstream connection (a *net.TCPConn satisfies it). ConnectEarly reads it
// while it waits for the response and interrupts a pending Read by setting a
// read deadline in the past; it clears the deadline before it returns.
//
// A source may also have the method
//
//	TryRead(p []byte) (int, error)
//
// reading only what is already there, without waiting: (0, nil) when
// nothing is. ConnectEarly then first takes what is there and sends it in
// the same write as the HEADERS; only if nothing was there does it start a
// goroutine that waits for bytes until the response. A client that sends
// its request at once (the usual client-speaks-first case) so costs no
// goroutine and no write of its own.
type EarlySource interface {
	Read(p []byte) (int, error)
	SetReadDeadline(t time.Time) error
}

// tryReader is an EarlySource with TryRead.
type tryReader interface {
	TryRead(p []byte) (int, error)
}

// maxEarly caps the bytes read from an EarlySource before the response: they
// are kept until the response arrives (a refused stream's retry sends them
// again), so the cap bounds what a connection in its connect phase holds.
// The stream's initial send window caps them further.
const maxEarly = 64 << 10

// earlyFirstBuf is the first read buffer's size: a client-speaks-first
// request usually fits; the buffer doubles, up to the cap, while it fills.
// It is a pooled chunk (databuf.go), given back when the connect ends
// (release): made for each connection, it was a third of the bytes an
// outbound proxy allocated per connection in gozt bench's connect scenario.
const earlyFirstBuf = 4 << 10

// errEarlyHalted ends an early write interrupted by halt.
var errEarlyHalted = errors.New("hbone: early write halted")

// early is the state of one ConnectEarly across its attempts (a pool retries
// a refused stream on another connection). One goroutine at a time, run,
// reads src and sends on the attempt's stream; the caller reads the fields
// only after halt has waited for it.
//
// The bytes are sent right after the request HEADERS, as x/net's Transport
// sends a request body, rather than after the 200, which would cost every
// client-speaks-first connection one more crossing of the tunnel before its
// request moves. A server must hold them until it has authorized the
// request and dialed the destination: gozt's hbone.Server buffers a stream's
// DATA until the handler reads it (TestEarlyDataHeldForHandler), and so
// does ztunnel, whose inbound (src/proxy/inbound.rs, serve_connect) reads
// the h2 RecvStream only in copy_bidirectional after send_response(200),
// while h2 buffers the DATA within the stream window it advertised
// (src/proxy/h2/server.rs, serve_connection: initial_window_size); on a
// refusal it answers with send_error and drops the RecvStream, and the
// bytes with it.
type early struct {
	src   EarlySource
	buf   []byte // every byte read from src so far
	chunk []byte // the pooled chunk buf lives in, or nil once it outgrew it
	err   error  // what ended reading src (io.EOF included), or nil
	stop  chan struct{}
	done  chan struct{}
	sent  int // bytes of buf the current attempt's stream took
}

// tryFirst takes what src already holds, if src can tell without waiting
// (tryReader) and nothing was read yet, for the HEADERS' write.
func (e *early) tryFirst() {
	tr, ok := e.src.(tryReader)
	if !ok || len(e.buf) > 0 || e.err != nil {
		return
	}
	if e.chunk == nil { // a retry after an attempt that read nothing has one
		e.chunk = getChunk(earlyFirstBuf)
	}
	n, err := tr.TryRead(e.chunk)
	e.buf, e.err = e.chunk[:n], err
}

// release gives the pooled chunk back. The connect calls it once no attempt
// can touch the bytes any more: every write of them has returned (they are
// copied into the connection's write buffer or written through) and the
// early sender, if it ran, has been halted.
func (e *early) release() {
	if e == nil {
		return
	}
	if e.chunk != nil {
		putChunk(e.chunk)
		e.chunk = nil
	}
	e.buf = nil
}

// waits reports whether the attempt needs the early sender: src has not
// ended and may hold more before the response, because nothing was read
// yet or tryFirst filled its whole buffer.
func (e *early) waits() bool {
	return e.err == nil && (len(e.buf) == 0 || len(e.buf) == cap(e.buf))
}

// start runs the early sender for s's attempt on its own goroutine: it
// sends what earlier attempts read beyond the e.sent bytes already sent,
// then reads src and sends on, up to limit bytes in all (at most the
// stream's initial send window).
func (e *early) start(s *stream, limit int) {
	e.stop = make(chan struct{})
	e.done = make(chan struct{})
	go e.run(s, min(limit, maxEarly))
}

func (e *early) run(s *stream, limit int) {
	defer close(e.done)
	for {
		if n := min(len(e.buf), limit); e.sent < n {
			w, err := s.write(e.buf[e.sent:n], e.stop)
			e.sent += w
			if err != nil {
				return // halted, or the stream failed: the response tells why
			}
		}
		if e.err != nil || len(e.buf) >= limit {
			return
		}
		select {
		case <-e.stop:
			return
		default:
		}
		if len(e.buf) == cap(e.buf) {
			e.grow(limit)
		}
		n, err := e.src.Read(e.buf[len(e.buf):cap(e.buf)])
		e.buf = e.buf[:len(e.buf)+n]
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				select {
				case <-e.stop:
					continue // halted: send what came with the read, if it can
				default:
				}
			}
			e.err = err
		}
	}
}

// grow gives buf room for more bytes, at most limit in all: the pooled
// first chunk if buf has no room at all yet, else a buffer twice as large
// that takes over buf's bytes. The early sender calls it between writes, so
// no write of the old bytes is in flight when the chunk goes back.
func (e *early) grow(limit int) {
	if cap(e.buf) == 0 {
		if e.chunk == nil {
			e.chunk = getChunk(earlyFirstBuf)
		}
		e.buf = e.chunk[:0:min(len(e.chunk), limit)]
		return
	}
	nb := make([]byte, len(e.buf), min(max(2*cap(e.buf), earlyFirstBuf), limit))
	copy(nb, e.buf)
	e.buf = nb
	if e.chunk != nil {
		putChunk(e.chunk)
		e.chunk = nil
	}
}

// halt stops the early sender, if it runs, waits for it and clears src's
// read deadline. It returns how many bytes the attempt's stream took.
func (e *early) halt() int {
	if e.done == nil {
		return e.sent
	}
	defer func() { e.stop, e.done = nil, nil }()
	close(e.stop)
	_ = e.src.SetReadDeadline(time.Unix(1, 0)) // wakes a pending Read
	<-e.done
	_ = e.src.SetReadDeadline(time.Time{})
	return e.sent
}

// finish completes a ConnectEarly attempt answered 200: it sends the bytes
// read but not yet sent (those beyond a retry's smaller window), and aborts
// the stream if reading src failed otherwise than with EOF (the relay would
// have aborted it on that failure). A src at EOF reads EOF again, so the
// relay's first read of it ends the write direction.
func (e *early) finish(s *ClientStream) error {
	if e.sent < len(e.buf) {
		if _, err := s.Write(e.buf[e.sent:]); err != nil {
			return err
		}
	}
	s.early = int64(len(e.buf))
	e.release()
	if e.err != nil && e.err != io.EOF {
		s.Abort()
	}
	return nil
}
