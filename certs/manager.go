package certs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/gozt/gozt/certs/identity"
)

// Issuer mints certificates (localca in local mode, istiod's CA later).
// Issue returns a new certificate for id or an error; it must honour ctx.
// The returned Cert is owned by the caller and never modified afterwards.
type Issuer interface {
	Issue(ctx context.Context, id identity.Identity) (*Cert, error)
}

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	Issuer Issuer           // required (NewManager panics if nil)
	Logger *slog.Logger     // if nil, logs are discarded
	Now    func() time.Time // if nil, time.Now
	// CRL is attached to every certificate the manager hands out
	// (Cert.WithCRL), so that handshakes with them check it; or nil.
	CRL *CRL
	// RootGrace is how long, at most, a root the CA no longer answers
	// stays trusted after its first answer without it (see Manager). If
	// zero, DefaultRootGrace is used.
	RootGrace time.Duration
}

// Backoff after a failed issue (SPEC §6.3): 1s, ×2 per failure, ±20%
// jitter, at most 150s.
const (
	backoffStart  = time.Second
	backoffMax    = 150 * time.Second
	backoffJitter = 0.2
)

// maxInFlight bounds concurrent Issue calls (SPEC §6.3: at most 8 CSRs).
const maxInFlight = 8

// Status strings for State.Status (SPEC §8.2 "certificates" state).
const (
	StatusInitializing = "Initializing"
	StatusAvailable    = "Available"
	statusUnavailable  = "Unavailable: "
)

// State is one identity's certificate state, for /config_dump.
type State struct {
	Identity identity.Identity
	Status   string // "Initializing", "Available", or "Unavailable: <error>"
	Cert     *Cert  // the latest certificate, or nil
}

// Manager caches one workload certificate per identity, shares one in-flight
// Issue among concurrent callers, and (while Run runs) prefetches
// certificates and renews them at half-life with per-identity backoff on
// failure.
//
// Invariants:
//   - entries holds one *entry per identity the manager knows; Forget
//     removes it, and a completing Issue updates an entry only if it is
//     still the one in the map.
//   - an entry has at most one in-flight Issue (entry.call); Get and Run
//     both join it.
//   - a cached cert is served until it expires, even while renewal fails.
//   - at most maxInFlight Issue calls run at once; the others wait for a
//     slot by priority (slots.go): real time (a Get waits) > warmup
//     (prefetch, or no valid cert) > background (rotation). A Get that
//     joins a waiting call raises it to real time.
//
// Root rotation (istio/ztunnel#1679): every certificate the manager hands
// out verifies peers against one set of roots, the union of the CA's
// answers (trust.go). When an answer brings a root the set lacks, or
// RootsChanged says the CA's root file changed, a new root generation
// starts: the set trusts old and new roots at once, and Run fetches every
// certificate of an older generation again without waiting for half-life.
// A root the CA stops answering is dropped once no leaf known to need it
// (ours, or a peer's seen in a handshake) is still valid, or RootGrace
// after it was retired, whichever is first.
type Manager struct {
	issuer Issuer
	crl    *CRL // or nil
	trust  *trust
	log    *slog.Logger
	now    func() time.Time
	wake   chan struct{} // 1-buffered: the refresh schedule changed

	mu      sync.Mutex
	entries map[identity.Identity]*entry
	running bool                   // a Run is active
	free    int                    // unused Issue slots
	queue   [numPriorities][]*call // calls waiting for a slot, oldest first
	gen     uint64                 // root generation: bumped when the roots change

	// issuerStatus is the issuer's latest outcomes, for the admin live
	// view; guarded by mu.
	issuerStatus IssuerStatus
}

// IssuerStatus is how the issuer (the CA) answered lately, for the admin
// live view.
type IssuerStatus struct {
	// OK reports whether the last Issue that ended (not cancelled by its
	// caller) succeeded.
	OK bool
	// Since is when OK last changed (the first outcome counts as a
	// change); zero before any Issue ended.
	Since time.Time
	// LastIssued is when the last certificate was issued, or zero.
	LastIssued time.Time
	// LastError is the last failure, or "" if none yet.
	LastError string
}

// IssuerStatus returns the issuer's latest outcomes.
func (m *Manager) IssuerStatus() IssuerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.issuerStatus
}

// noteIssueLocked records one Issue's outcome in m.issuerStatus.
func (m *Manager) noteIssueLocked(now time.Time, err error) {
	st := &m.issuerStatus
	if st.Since.IsZero() || st.OK != (err == nil) {
		st.OK, st.Since = err == nil, now
	}
	if err != nil {
		st.LastError = err.Error()
	} else {
		st.LastIssued = now
	}
}

// entry is one identity's cache slot; all fields are guarded by Manager.mu.
type entry struct {
	id       identity.Identity
	cert     *Cert     // latest good certificate, or nil
	err      error     // last failure since the last success, or nil
	failures int       // consecutive failures, for backoff
	next     time.Time // when Run should (re)issue; zero: not scheduled
	call     *call     // in-flight Issue, or nil
	gen      uint64    // root generation cert was fetched in
}

// call is one in-flight Issue; result fields are written before done closes.
type call struct {
	done chan struct{}
	ctx  context.Context // the issuing caller's ctx, to tell its cancellation apart
	cert *Cert
	err  error

	// Guarded by Manager.mu.
	gen    uint64 // root generation when the call started
	prio   priority
	run    bool               // started by Run (prefetch, rotation, retry)
	cancel context.CancelFunc // for a Run call: cancels ctx (Forget)
	queued bool               // waiting in Manager.queue
	ready  chan struct{}      // closed when a queued call is granted a slot
}

// NewManager returns a Manager. It panics if cfg.Issuer is nil.
func NewManager(cfg ManagerConfig) *Manager {
	if cfg.Issuer == nil {
		panic("certs: NewManager: nil Issuer")
	}
	m := &Manager{
		issuer:  cfg.Issuer,
		crl:     cfg.CRL,
		trust:   newTrust(cfg.RootGrace),
		log:     cfg.Logger,
		now:     cfg.Now,
		free:    maxInFlight,
		wake:    make(chan struct{}, 1),
		entries: make(map[identity.Identity]*entry),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	return m
}

// Get returns a valid certificate for id, issuing one if needed. Concurrent
// callers for the same id share one in-flight Issue (single flight). A
// cached cert is returned while valid. If the caller that started the
// shared Issue gives up (its ctx ends), the others retry themselves. While
// Run is active and the identity has no valid cert and is backing off after
// a failure, Get returns that failure at once instead of issuing. A Get
// that must wait for an Issue slot goes before every prefetch and rotation,
// and raises a prefetch or rotation of id that waits for a slot above them.
func (m *Manager) Get(ctx context.Context, id identity.Identity) (*Cert, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("%w: zero identity", ErrIdentityMismatch)
	}
	for {
		c, e, cl, leader, err := m.lookup(ctx, id)
		if c != nil || err != nil {
			return c, err
		}
		if leader {
			m.issue(e, cl)
		} else {
			select {
			case <-cl.done:
			case <-ctx.Done():
				return nil, wrap(ctx.Err())
			}
		}
		if cl.err != nil && cl.ctx.Err() != nil && !leader {
			continue // the leader gave up, not the issuer; try ourselves
		}
		return cl.cert, cl.err
	}
}

// lookup returns id's valid cached cert, or its current failure while
// backing off, or else the in-flight call to wait for, starting one (leader)
// if there is none.
func (m *Manager) lookup(ctx context.Context, id identity.Identity) (c *Cert, e *entry, cl *call, leader bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e = m.entryLocked(id)
	now := m.now()
	if e.cert != nil && e.cert.validAt(now) {
		return e.cert, e, nil, false, nil
	}
	if e.call == nil && e.err != nil && m.running && now.Before(e.next) {
		// Failing and backing off: fail fast with the reason rather than
		// send every new connection's request to a CA that is down; Run
		// retries on schedule (SPEC §6.3, TESTPLAN F8).
		return nil, e, nil, false, e.err
	}
	if e.call != nil {
		m.bumpLocked(e.call) // a caller waits now (SPEC §6.3)
		return nil, e, e.call, false, nil
	}
	return nil, e, m.startLocked(ctx, e, prioRealTime), true, nil
}

// entryLocked returns id's entry, creating it if needed.
func (m *Manager) entryLocked(id identity.Identity) *entry {
	e := m.entries[id]
	if e == nil {
		e = &entry{id: id}
		m.entries[id] = e
	}
	return e
}

// startLocked registers a new in-flight call on e, issued under ctx at
// priority prio.
func (m *Manager) startLocked(ctx context.Context, e *entry, prio priority) *call {
	cl := &call{done: make(chan struct{}), ctx: ctx, prio: prio, gen: m.gen}
	e.call = cl
	return cl
}

// issue runs cl's Issue (bounded by the in-flight limit), records the
// outcome on e and releases cl's waiters.
func (m *Manager) issue(e *entry, cl *call) {
	cert, err := m.issueOne(cl, e.id)
	// Learn the answer's roots before any caller can handshake with it.
	newRoot := err == nil && m.trust.learn(cert, m.now())
	cl.cert, cl.err = cert, err

	m.mu.Lock()
	defer m.mu.Unlock()
	e.call = nil
	close(cl.done)
	now := m.now()
	if err == nil || cl.ctx.Err() == nil {
		m.noteIssueLocked(now, err)
	}
	if newRoot {
		m.log.Info("the CA answered with a new root; trusting old and new roots, fetching every certificate again",
			"identity", e.id.String())
		m.rotateLocked(now)
		cl.gen = m.gen // this answer is already from the new chain
	}
	if m.entries[e.id] != e {
		return // forgotten meanwhile
	}
	switch {
	case err == nil:
		e.cert, e.err, e.failures, e.gen = cert, nil, 0, cl.gen
		e.next = cert.RefreshTime()
		if e.gen != m.gen {
			e.next = now // asked before the roots changed: again, from the new chain
		}
		m.log.Debug("certificate issued", "identity", e.id.String(), "notAfter", cert.NotAfter(), "refresh", e.next)
	case cl.ctx.Err() != nil:
		// The caller gave up (or Run stopped); that says nothing about the
		// CA. If a cert exists or Run was fetching, make sure a fetch is
		// still scheduled.
		if (e.cert != nil || cl.run) && e.next.IsZero() {
			e.next = now
		}
	default:
		e.failures++
		e.err = err
		e.next = now.Add(backoff(e.failures))
		if e.cert != nil && e.cert.validAt(now) && e.cert.NotAfter().Before(e.next) {
			e.next = e.cert.NotAfter() // retry no later than expiry (SPEC §6.3)
		}
		m.log.Warn("certificate fetch failed", "identity", e.id.String(), "failures", e.failures,
			"retry", e.next, "error", err)
	}
	m.wakeLocked()
}

// issueOne calls the issuer once for cl, holding an Issue slot, and
// checks what it returned.
func (m *Manager) issueOne(cl *call, id identity.Identity) (*Cert, error) {
	if err := m.acquire(cl); err != nil {
		return nil, err
	}
	defer m.release()
	cert, err := m.issuer.Issue(cl.ctx, id)
	switch {
	case err != nil:
		return nil, fmt.Errorf("certs: issue %v: %w", id, err)
	case cert == nil:
		return nil, fmt.Errorf("certs: issue %v: issuer returned no certificate", id)
	case cert.Identity != id:
		return nil, fmt.Errorf("%w: issued for %v, requested %v", ErrIdentityMismatch, cert.Identity, id)
	case !cert.validAt(m.now()):
		return nil, fmt.Errorf("certs: issue %v: %w (notAfter %v)", id, ErrExpired, cert.NotAfter())
	}
	bound := *cert // verifies peers against every root the manager trusts
	bound.trust = m.trust
	if m.crl != nil {
		bound.crl = m.crl
	}
	return &bound, nil
}

// rotateLocked starts a new root generation: every certificate fetched in
// an older one is fetched again at once (by Run, at background priority)
// rather than at half-life, so the node's leaves move to the CA's new
// chain while the old root is still trusted. A fetch in flight finishes
// and is then made again.
func (m *Manager) rotateLocked(now time.Time) {
	m.gen++
	for _, e := range m.entries {
		if e.cert != nil && e.call == nil && (e.next.IsZero() || e.next.After(now)) {
			e.next = now
		}
	}
	m.wakeLocked()
}

// RootsChanged tells m that the CA's roots may have changed (its root
// certificate file did): as when an answer brings a new root, Run fetches
// every certificate again at once, and an answer with a new root is
// trusted beside the old ones.
func (m *Manager) RootsChanged() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log.Info("CA roots changed; fetching every certificate again")
	m.rotateLocked(m.now())
}

// backoff returns the delay before retry number n (n ≥ 1).
func backoff(n int) time.Duration {
	d := backoffStart
	for i := 1; i < n && d < backoffMax; i++ {
		d *= 2
	}
	d = time.Duration(float64(d) * (1 - backoffJitter + 2*backoffJitter*rand.Float64()))
	return min(d, backoffMax)
}

// wakeLocked tells Run that the schedule changed.
func (m *Manager) wakeLocked() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Prefetch asks for id's certificate ahead of need (SPEC §6.3 Warmup: a
// local workload appeared) without waiting for it. Run fetches it at warmup
// priority, below callers waiting in Get and above rotations; without Run
// the identity is only registered. Prefetch does nothing for a zero id or
// for an identity with a valid cert, a fetch in flight, or a failure it is
// backing off from.
func (m *Manager) Prefetch(id identity.Identity) {
	if id.IsZero() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entryLocked(id)
	now := m.now()
	if e.call != nil || e.err != nil || e.cert != nil && e.cert.validAt(now) {
		return
	}
	if e.next.IsZero() || e.next.After(now) {
		e.next = now
	}
	m.wakeLocked()
}

// Forget drops id's cached certificate and stops renewing it (the last
// local workload with id is gone). A prefetch or rotation in flight for id
// is cancelled; an Issue a Get waits for still completes for its waiters
// but is not cached.
func (m *Manager) Forget(id identity.Identity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil && e.call != nil && e.call.cancel != nil && e.call.prio != prioRealTime {
		e.call.cancel()
	}
	delete(m.entries, id)
}

// States lists every identity the manager knows, sorted by identity string,
// for /config_dump.
func (m *Manager) States() []State {
	m.mu.Lock()
	now := m.now()
	out := make([]State, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, State{Identity: e.id, Status: e.statusLocked(now), Cert: e.cert})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b State) int {
		return cmp.Compare(a.Identity.String(), b.Identity.String())
	})
	return out
}

// statusLocked is e's State.Status at now.
func (e *entry) statusLocked(now time.Time) string {
	switch {
	case e.cert != nil && e.cert.validAt(now):
		return StatusAvailable
	case e.err != nil:
		return statusUnavailable + e.err.Error()
	case e.cert != nil:
		return statusUnavailable + ErrExpired.Error()
	}
	return StatusInitializing
}

// Run fetches prefetched identities, refreshes cached certificates at
// half-life (at once after the roots changed) and drops old roots (see
// Manager) until ctx is done; on failure it keeps serving the old
// still-valid cert and retries with backoff (1s ×2 ±20% jitter, max 150s,
// and no later than the cert's expiry). It returns nil after ctx is done,
// only once every goroutine it started has exited, or ErrManagerRunning if
// another Run is active.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return ErrManagerRunning
	}
	m.running = true
	m.mu.Unlock()

	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
	}()

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := m.startDue(ctx, &wg)
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		case <-timer.C:
		}
	}
}

// idleWait is how long Run sleeps when nothing is scheduled (a wake-up
// arrives as soon as something is).
const idleWait = time.Hour

// startDue drops the old roots whose time is up, starts a fetch for every
// entry that is due and has no Issue in flight (at warmup priority without
// a valid cert, else background), and returns how long to wait until the
// next one is due.
func (m *Manager) startDue(ctx context.Context, wg *sync.WaitGroup) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	wait := idleWait
	if drop := m.trust.prune(now, m.log); !drop.IsZero() {
		wait = min(wait, drop.Sub(now))
	}
	for _, e := range m.entries {
		if e.next.IsZero() || e.call != nil {
			continue
		}
		if d := e.next.Sub(now); d > 0 {
			wait = min(wait, d)
			continue
		}
		e.next = time.Time{} // issue() schedules the next one
		prio := prioBackground
		if e.cert == nil || !e.cert.validAt(now) {
			prio = prioWarmup
		}
		cctx, cancel := context.WithCancel(ctx)
		cl := m.startLocked(cctx, e, prio)
		cl.run, cl.cancel = true, cancel
		wg.Go(func() { m.refresh(e, cl) })
	}
	return wait
}

// refresh fetches one entry's cert for Run (prefetch, rotation or retry);
// it is a named function so it shows up in goroutine dumps.
func (m *Manager) refresh(e *entry, cl *call) {
	defer cl.cancel()
	m.issue(e, cl)
}
