package connmgr

import "github.com/gozt/gozt/state"

// Passes returns the number of completed re-check passes.
func (m *Manager) Passes() uint64 { return m.passes.Load() }

// Rechecker runs re-check passes on the caller's goroutine, reusing its
// scratch space like Run does (for benchmarks; Run must not be active).
type Rechecker struct {
	m   *Manager
	buf []*entry
}

// NewRecheckerForTest returns a Rechecker for m.
func NewRecheckerForTest(m *Manager) *Rechecker { return &Rechecker{m: m} }

// Recheck runs one pass against snap.
func (r *Rechecker) Recheck(snap *state.Snapshot) { r.buf = r.m.recheck(snap, r.buf) }

// LastChecked returns the snapshot of the last completed pass, or nil.
func (m *Manager) LastChecked() *state.Snapshot { return m.checked.Load() }
