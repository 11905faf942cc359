package connmgr

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// ErrPolicyChanged is what a connection's close function receives when a
// re-check denies it (SPEC §4.4; the access log shows it with flag DENY).
var ErrPolicyChanged = errors.New("connection closed due to policy change")

// ErrRunning is returned by Run when another Run of the same Manager is
// active.
var ErrRunning = errors.New("connmgr: Run already active")

// Values of Info.Inbound.
const (
	InboundHBONE = "HBONE" // inbound HBONE (15008)
	InboundTCP   = "TCP"   // inbound plaintext (15006)
)

// Info is what RBAC needs to know about one live inbound connection.
type Info struct {
	// WorkloadUID is the destination (local) workload's uid.
	WorkloadUID string
	// Conn is the connection as authorization sees it: source, destination
	// (pod IP and resolved target port) and peer identity.
	Conn rbac.Conn
	// Inbound is InboundHBONE or InboundTCP (plaintext), for listing.
	Inbound string
	// Checked, if non-nil, is the snapshot the caller has just authorized
	// the connection against: Register skips re-evaluating it when it is
	// still the newest. Register does not keep it.
	Checked *state.Snapshot
}

// Config configures a Manager.
type Config struct {
	// Logger receives one line per connection closed by a re-check. Nil
	// means no logging.
	Logger *slog.Logger
}

// Manager is the registry of live inbound connections.
//
// Invariants:
//   - byWorkload holds every registered entry until unregister, or a
//     re-check that closes it, removes it; remove checks membership, so an
//     entry is removed once whoever gets there first.
//   - An entry's close function runs only after the re-check moved its state
//     from live to closed (a compare-and-swap), so it runs at most once, and
//     never for an entry unregister already moved to unregistered.
type Manager struct {
	log *slog.Logger

	// latest is the newest notified snapshot, or nil before the first
	// Notify.
	latest atomic.Pointer[state.Snapshot]
	// recheckAll asks the loop for a full pass even if latest was already
	// checked (set by Register when latest denies a new connection).
	recheckAll atomic.Bool
	// wake has room for one pending wake-up; Notify never blocks on it.
	wake    chan struct{}
	running atomic.Bool
	passes  atomic.Uint64                  // completed re-check passes, for tests
	checked atomic.Pointer[state.Snapshot] // snapshot of the last pass, for tests

	mu         sync.Mutex
	byWorkload map[string]map[*entry]struct{} // workload uid → its connections
	n          int                            // number of entries in byWorkload
}

// entry is one registered connection.
type entry struct {
	info  Info
	close func(error)
	state atomic.Uint32
}

// Entry states.
const (
	stateLive uint32 = iota
	stateClosed
	stateUnregistered
)

// New returns a Manager. Call Run to start re-checking.
func New(cfg Config) *Manager {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{
		log:        log,
		wake:       make(chan struct{}, 1),
		byWorkload: map[string]map[*entry]struct{}{},
	}
}

// Register tracks a connection. close is called (at most once, from Run's
// goroutine) with ErrPolicyChanged when a re-check denies the connection; it
// should close the connection and return promptly. The returned func stops
// tracking it; it is idempotent and safe to call from any goroutine,
// including from close.
func (m *Manager) Register(info Info, close func(error)) (unregister func()) {
	checked := info.Checked
	info.Checked = nil // never pin an old snapshot for the connection's life
	e := &entry{info: info, close: close}
	m.mu.Lock()
	set := m.byWorkload[info.WorkloadUID]
	if set == nil {
		set = map[*entry]struct{}{}
		m.byWorkload[info.WorkloadUID] = set
	}
	set[e] = struct{}{}
	m.n++
	m.mu.Unlock()

	// The entry is visible to every pass that starts from now on. A pass for
	// a snapshot notified before this point may already have listed the
	// entries without it, so check the newest snapshot here (unless it is the
	// one the caller authorized against); if it denies, ask for a pass
	// (which closes the connection from Run's goroutine).
	if snap := m.latest.Load(); snap != nil && snap != checked {
		if d := decide(snap, &e.info); !d.Allow {
			m.recheckAll.Store(true)
			m.signal()
		}
	}
	return func() { m.unregister(e) }
}

func (m *Manager) unregister(e *entry) {
	e.state.CompareAndSwap(stateLive, stateUnregistered)
	m.remove(e)
}

// remove deletes e from the registry if it is still there.
func (m *Manager) remove(e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.byWorkload[e.info.WorkloadUID]
	if _, ok := set[e]; !ok {
		return
	}
	delete(set, e)
	m.n--
	if len(set) == 0 {
		delete(m.byWorkload, e.info.WorkloadUID)
	}
}

// Notify tells the manager the state changed. It never blocks (it is called
// from the state writer). Run re-checks every tracked connection against the
// newest snapshot soon after; bursts coalesce. A nil snap is ignored.
func (m *Manager) Notify(snap *state.Snapshot) {
	if snap == nil {
		return
	}
	m.latest.Store(snap)
	m.signal()
}

// signal wakes Run without blocking. Whoever stores to latest or recheckAll
// before calling signal is seen by Run: either this send succeeds, or a
// wake-up is already pending and Run has not yet read the state.
func (m *Manager) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run is the re-check loop. It returns nil when ctx is done (it starts no
// other goroutine), or ErrRunning if another Run is active. A notification
// that arrived before Run started is acted on at once.
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	var (
		checked *state.Snapshot
		scratch []*entry
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		}
		snap := m.latest.Load()
		all := m.recheckAll.Swap(false)
		if snap == nil || (snap == checked && !all) {
			continue
		}
		scratch = m.recheck(snap, scratch)
		checked = snap
	}
}

// recheck evaluates every tracked connection against snap and closes those
// denied. It lists the entries under the lock and evaluates outside it, so
// Register and unregister never wait for a whole pass. buf is scratch space,
// returned (emptied) for reuse.
func (m *Manager) recheck(snap *state.Snapshot, buf []*entry) []*entry {
	buf = buf[:0]
	m.mu.Lock()
	for _, set := range m.byWorkload {
		for e := range set {
			buf = append(buf, e)
		}
	}
	m.mu.Unlock()

	closed := 0
	for _, e := range buf {
		if e.state.Load() != stateLive {
			continue
		}
		d := decide(snap, &e.info)
		if d.Allow {
			continue
		}
		if !e.state.CompareAndSwap(stateLive, stateClosed) {
			continue // unregistered meanwhile
		}
		m.remove(e)
		m.logClose(e, d)
		e.close(ErrPolicyChanged)
		closed++
	}
	clear(buf) // drop references to finished connections
	m.checked.Store(snap)
	m.passes.Add(1)
	if closed > 0 {
		m.log.Debug("policy re-check done", "generation", snap.Generation(), "checked", len(buf), "closed", closed)
	}
	return buf[:0]
}

// decision is the outcome of one re-check: an rbac decision, or a denial
// because the destination workload no longer exists.
type decision struct {
	rbac.Decision
	workloadGone bool
}

func (d decision) String() string {
	if d.workloadGone {
		return "destination workload removed"
	}
	return d.Decision.String()
}

// decide evaluates one connection against snap (SPEC §4.2–4.3 through
// rbac.Evaluate). A workload missing from snap denies.
func decide(snap *state.Snapshot, info *Info) decision {
	w := snap.WorkloadByUID(info.WorkloadUID)
	if w == nil {
		return decision{workloadGone: true}
	}
	t := rbac.Target{Namespace: w.Namespace, PolicyRefs: w.AuthorizationPolicies}
	return decision{Decision: rbac.Evaluate(snap, t, info.Conn)}
}

func (m *Manager) logClose(e *entry, d decision) {
	m.log.Info("connection closed due to policy change",
		"workload", e.info.WorkloadUID,
		"inbound", e.info.Inbound,
		"src", e.info.Conn.Src,
		"dst", e.info.Conn.Dst,
		"identity", e.info.Conn.Identity.String(),
		"reason", d.String())
}

// Connections returns the tracked connections of one workload, ordered by
// source then destination address, in a new slice (for config_dump's
// workloadState).
func (m *Manager) Connections(workloadUID string) []Info {
	m.mu.Lock()
	set := m.byWorkload[workloadUID]
	out := make([]Info, 0, len(set))
	for e := range set {
		out = append(out, e.info)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Info) int {
		return cmp.Or(a.Conn.Src.Compare(b.Conn.Src), a.Conn.Dst.Compare(b.Conn.Dst))
	})
	return out
}

// Len returns the number of tracked connections.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}
