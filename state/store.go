package state

import (
	"sync"
	"sync/atomic"
)

// Config configures a Store.
type Config struct {
	// OnUpdate, if non-nil, is called after each published change with the
	// previous and the new snapshot, on the goroutine that called Update and
	// while the store's writer lock is held (so calls are serialized and in
	// order). It must not call Update.
	OnUpdate func(prev, next *Snapshot)
}

// Store is the node's mesh state.
//
// Invariants:
//   - One writer at a time: Update holds mu for the whole batch.
//   - Readers never lock: Snapshot is an atomic load of an immutable value.
//   - Every published Snapshot stays valid and unchanged forever.
type Store struct {
	cfg Config

	mu sync.Mutex // serializes writers; guards nothing readers touch

	cur atomic.Pointer[Snapshot] // never nil after NewStore
}

// NewStore returns an empty store.
func NewStore(cfg Config) *Store {
	s := &Store{cfg: cfg}
	s.cur.Store(emptySnapshot())
	return s
}

// Snapshot returns the current snapshot. It never blocks.
func (s *Store) Snapshot() *Snapshot { return s.cur.Load() }

// Update calls fn with a Batch and then publishes one new snapshot holding
// all of the batch's changes (none if the batch changed nothing). Writers
// are serialized. The Batch must not be used after fn returns. If fn panics
// nothing is published.
func (s *Store) Update(fn func(b *Batch)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.cur.Load()
	b := newBatch(prev)
	fn(b)
	next := b.commit()
	if next == nil {
		return
	}
	s.cur.Store(next)
	if s.cfg.OnUpdate != nil {
		s.cfg.OnUpdate(prev, next)
	}
}
