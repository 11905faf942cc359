package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/gozt/gozt/internal/workers"
)

// Start copies bytes both ways between a and b on goroutines of its own: it
// returns at once, and calls done, once both directions have ended, with how
// many bytes went each way and the error that ended the copy. The caller may
// go on or return meanwhile; done is where it closes the legs.
//
// When a direction reads EOF it half-closes its destination with CloseWrite
// if the destination has that method (*net.TCPConn, *tls.Conn, HBONE
// streams). A destination without CloseWrite cannot be told about the EOF
// without ending the other direction too, so it is closed only once both
// directions have ended.
//
// When either direction fails, both conns are closed, so the other direction
// unblocks, and done gets the first failure, wrapped with the direction;
// resets, broken pipes and use of a closed conn end the copy with a nil error.
// When a leg's peer resets it (an HBONE stream with AfterReset), the other
// leg is closed once the bytes received before the reset are delivered, or
// after half a second (peerreset.go). Apart from these cases Start does not
// close a or b: done does.
//
// aToB and bToA, if non-nil, have the bytes of each direction added as they
// are written, so a metrics reader can follow a long connection. On spliced
// TCP legs they advance in steps of at most 1 MiB (the splice chunk) or when
// the direction ends. The Result counts only this copy's bytes.
//
// A connection relayed this way can cost much less while idle than one whose
// handler blocks until the copy ends (DESIGN "Making HBONE fast": keep the
// long-lived goroutine's stack small). Whatever the handler did before
// (routing, dialing, TLS) grew its stack, and a parked goroutine keeps its
// stack: the runtime shrinks it only to four times what it uses, so it stays
// well above the minimum. When one leg is an HBONE stream that pushes (see
// the package doc) and the other a *net.TCPConn, Start's direction from the
// TCP socket instead runs as a chain of goroutines: each waits for the socket
// to become readable, copies what is there, then leaves the next wait to a
// fresh goroutine and exits. So the one goroutine an idle connection has only
// ever waited, and has the runtime's smallest stack; a non-nil p goes
// further and leaves an idle connection no goroutine (park.go), while a nil
// p parks nothing. Only the first turn runs on a reused goroutine
// (internal/workers), as short-lived as the handler before it. Other legs
// are copied by one goroutine per direction.
func (p *Poller) Start(a, b net.Conn, aToB, bToA *atomic.Int64, done func(Result, error)) {
	st := newCopyState(a, b, aToB, bToA)
	st.pair.started = done
	st.pair.poller = p
	workers.Default.Go(st.runStarted)
}

// runStarted is the first goroutine of a Start. It runs on a worker
// (package workers), whose stack earlier tasks grew, so it keeps only the
// short part: a pulled direction's first turn, which parks or respawns
// once the socket idles (pull). A direction copied by one goroutine for the
// connection's whole life gets a fresh one, whose stack holds only what
// that copy needs.
func (st *copyState) runStarted() {
	st.watchResets()
	pull := st.startPush()
	if pull != nil {
		if r := newSockReader(pull.src().(*net.TCPConn)); r != nil {
			pull.pull(r)
			return
		}
		go st.runLast(pull)
		return
	}
	st.pair.wg.Add(1)
	go runHalf(&st.ab)
	go st.runLast(&st.ba)
}

// runLast copies h's direction, then waits for the others and ends the
// Start.
func (st *copyState) runLast(h *half) {
	h.run()
	st.finishStarted()
}

// idleRespawn is how long a goroutine of a started copy that has copied
// bytes (and so grown its stack) keeps waiting for more before it leaves the
// wait to a fresh goroutine. A connection busier than that never pays for a
// new goroutine; an idle one pays once per idle period (a few microseconds
// of CPU, against 2 KiB or more of stack held for the whole idle time).
const idleRespawn = 20 * time.Millisecond

// pull is one turn of a started copy's direction from a TCP socket (a push
// is running the other way): it waits until the socket is readable and
// copies until a read comes back short of its buffer (the socket is drained
// for now), again while more bytes come within idleRespawn; then it starts
// the next turn on a new goroutine and exits. So an idle connection's wait
// happens on a goroutine that has done nothing else, whose stack is the
// runtime's smallest, and the deep work (TLS, HTTP/2 framing) grows only the
// stacks of goroutines that end soon.
//
// With a Poller (park.go) the idle wait has no goroutine at all: a turn
// first waits up to idleRespawn on its goroutine, and once the socket has
// been quiet that long it parks it in the Poller and exits; the Poller
// starts the next turn when the socket is readable. The short waits keep a
// connection that is busy (a request and its response, say) off the epoll
// calls, which cost a wake-up of its Set's goroutine and two system calls
// per turn.
//
// Start owns the socket's read deadline meanwhile: it sets one for the
// short waits.
func (h *half) pull(r *sockReader) {
	var (
		buf []byte
		n   int
		err error
	)
	if h.p.poller.usable() {
		buf, n, err = h.readBriefly(r)
		if err == errIdle {
			if h.p.poller.park(h, r) {
				return
			}
			buf, n, err = h.readSocket(r, true)
		}
	} else {
		buf, n, err = h.readSocket(r, true)
	}
	h.copyTurn(r, buf, n, err)
}

// pullReadable is pull for a turn the Poller starts because its one-shot
// event reported the socket readable (or closed): the wait is done, so the
// turn reads at once, without pull's deadline changes.
func (h *half) pullReadable(r *sockReader) {
	buf, n, err := h.readSocket(r, false)
	if err == errWouldBlock { // nothing after all: wait again
		h.pull(r)
		return
	}
	h.copyTurn(r, buf, n, err)
}

// copyTurn is the copying part of a turn whose first read returned buf, n
// and err: it copies while bytes come (see pull), then hands the wait on or
// ends the direction.
func (h *half) copyTurn(r *sockReader, buf []byte, n int, err error) {
	for err == nil {
		full := n == len(buf)
		if err = h.writeChunk(buf, n); err != nil {
			break
		}
		if full { // more is likely queued: look before waiting
			if buf, n, err = h.readSocket(r, false); err != errWouldBlock {
				continue
			}
		}
		if buf, n, err = h.readBriefly(r); err == errIdle {
			if !h.p.poller.park(h, r) {
				go h.pull(r)
			}
			return
		}
	}
	if err == io.EOF {
		err = nil
	}
	h.endPull(err)
}

// readBriefly reads h.src, waiting up to idleRespawn for it to become
// readable. It returns what readSocket does, or errIdle if nothing came.
func (h *half) readBriefly(r *sockReader) ([]byte, int, error) {
	src := h.src().(*net.TCPConn)
	if err := src.SetReadDeadline(time.Now().Add(idleRespawn)); err != nil {
		return nil, 0, readError(err)
	}
	buf, n, rerr := r.read(bufferSize(h.n), true)
	if err := src.SetReadDeadline(time.Time{}); err != nil {
		if buf != nil {
			putBuffer(buf)
		}
		return nil, 0, readError(err)
	}
	switch {
	case rerr == nil, rerr == io.EOF:
		return buf, n, rerr
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		return nil, 0, errIdle
	}
	return nil, 0, readError(rerr)
}

// endPull ends the pulling direction: it half-closes the destination or
// aborts the pair (as run does), then waits for the pushing direction on a
// new goroutine, so that this one's stack, grown by the copy, is freed.
func (h *half) endPull(err error) {
	h.p.poller.forget(h)
	h.end(err)
	go h.p.st.finishStarted()
}

// finishStarted waits for the directions still running and calls the
// Start's done.
func (st *copyState) finishStarted() {
	st.wait()
	st.pair.started(st.result())
}
