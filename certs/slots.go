package certs

import "slices"

// priority orders fetches competing for the maxInFlight Issue slots (SPEC
// §6.3): a caller waiting now beats a prefetch beats a rotation.
type priority int8

const (
	prioBackground priority = iota // rotation of a still-valid cert
	prioWarmup                     // prefetch, or a retry for an identity without a valid cert
	prioRealTime                   // a Get is waiting for it
	numPriorities
)

func (p priority) String() string {
	switch p {
	case prioBackground:
		return "background"
	case prioWarmup:
		return "warmup"
	case prioRealTime:
		return "realtime"
	}
	return "invalid"
}

// Issue slots. The Manager keeps, under mu, the number of free slots and,
// per priority, a FIFO of calls waiting for one. A freed slot goes to the
// oldest call of the highest priority; only when none waits does the free
// count grow. So a call waits only when all slots are taken, and while one
// waits, free is 0.

// acquire takes an Issue slot for cl, waiting in cl's priority queue if
// none is free. It returns cl.ctx's error, holding no slot, if cl.ctx ends
// first.
func (m *Manager) acquire(cl *call) error {
	m.mu.Lock()
	if m.free > 0 {
		m.free--
		m.mu.Unlock()
		return nil
	}
	cl.ready = make(chan struct{})
	cl.queued = true
	m.queue[cl.prio] = append(m.queue[cl.prio], cl)
	m.mu.Unlock()

	select {
	case <-cl.ready:
		return nil
	case <-cl.ctx.Done():
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cl.queued {
		m.dequeueLocked(cl)
	} else {
		m.releaseLocked() // granted as ctx ended: pass the slot on
	}
	return wrap(cl.ctx.Err())
}

// release returns a slot taken by acquire.
func (m *Manager) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseLocked()
}

// releaseLocked hands a slot to the oldest waiting call of the highest
// priority, or marks it free.
func (m *Manager) releaseLocked() {
	for p := numPriorities - 1; p >= 0; p-- {
		if q := m.queue[p]; len(q) > 0 {
			cl := q[0]
			m.queue[p] = slices.Delete(q, 0, 1)
			cl.queued = false
			close(cl.ready)
			return
		}
	}
	m.free++
}

// dequeueLocked removes the queued cl from its priority's queue.
func (m *Manager) dequeueLocked(cl *call) {
	m.queue[cl.prio] = slices.DeleteFunc(m.queue[cl.prio], func(o *call) bool { return o == cl })
	cl.queued = false
}

// bumpLocked raises cl to real-time priority: a caller now waits for it. A
// queued cl moves to the back of the real-time queue, ahead of every
// prefetch and rotation.
func (m *Manager) bumpLocked(cl *call) {
	if cl.prio == prioRealTime {
		return
	}
	if cl.queued {
		m.dequeueLocked(cl)
		cl.queued = true
		m.queue[prioRealTime] = append(m.queue[prioRealTime], cl)
	}
	cl.prio = prioRealTime
}
