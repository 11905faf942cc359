package relay

import "time"

// A leg's peer can end both directions of the leg at once while its reads
// still end cleanly: an HBONE stream reads a reset with NO_ERROR or CANCEL
// as EOF (SPEC §2.2), so the direction from it half-closes its destination
// as after a FIN, but nothing written to the stream reaches the peer any
// more. The opposite direction then waits on the other leg for bytes it
// cannot deliver, for as long as that leg's application neither writes nor
// closes. So once the direction from the reset leg has delivered what it
// received before the reset, or after resetLinger at most, the other leg is
// closed, which ends the opposite direction (issue 14, defect 7).

// resetNotifier is a leg that reports its peer's reset. hbone's streams
// implement it.
type resetNotifier interface {
	// AfterReset arranges for f to be called once when the peer resets
	// the conn, at once if it already has. f must not block.
	AfterReset(f func())
}

// resetLinger bounds how long, after a leg's peer reset it, the direction
// from that leg may take to deliver the bytes it received before the reset
// (to a destination that reads slowly, or not at all) before the other leg
// is closed anyway. TESTPLAN F16 wants the upstream of an aborted client
// closed within a second.
const resetLinger = 500 * time.Millisecond

// watchResets registers for the reset of each leg that reports one.
func (st *copyState) watchResets() {
	if rn, ok := st.ab.src().(resetNotifier); ok {
		rn.AfterReset(st.ab.srcReset)
	}
	if rn, ok := st.ba.src().(resetNotifier); ok {
		rn.AfterReset(st.ba.srcReset)
	}
}

// srcReset is called when h.src's peer reset it. h itself ends soon, with
// the bytes received before the reset and an EOF; h.dst is closed once it
// has (markEnded), or after resetLinger.
func (h *half) srcReset() {
	p := h.p
	p.mu.Lock()
	if h.reset || p.aborted || p.finished {
		p.mu.Unlock()
		return
	}
	h.reset = true
	ended := h.ended
	if !ended {
		h.resetTimer = time.AfterFunc(resetLinger, h.closeDstAfterReset)
	}
	p.mu.Unlock()
	if ended {
		h.closeDstAfterReset()
	}
}

// markEnded records that h has ended, after its half-close or its failure,
// and closes h.dst if h.src was reset.
func (h *half) markEnded() {
	p := h.p
	p.mu.Lock()
	h.ended = true
	reset := h.reset
	if h.resetTimer != nil {
		h.resetTimer.Stop()
	}
	p.mu.Unlock()
	if reset {
		h.closeDstAfterReset()
	}
}

// closeDstAfterReset closes h.dst, unless the copy was aborted or has
// finished: a plain close, so that h.dst's peer still gets what h wrote and
// an orderly end; the opposite direction's read then fails as on a conn
// closed under the copy, which ends the copy without an error.
func (h *half) closeDstAfterReset() {
	p := h.p
	p.mu.Lock()
	skip := h.dstClosed || p.aborted || p.finished
	h.dstClosed = true
	p.mu.Unlock()
	if !skip {
		// The close can only report that the conn is already closed.
		_ = p.poller.CloseConn(h.dst())
	}
}
