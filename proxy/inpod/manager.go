package inpod

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gozt/gozt/proxy/netns"
	"github.com/prometheus/client_golang/prometheus"
	"istio.io/istio/pkg/zdsapi"
)

// WorkloadInfo is the pod identity istio-cni sends (zdsapi.WorkloadInfo).
type WorkloadInfo struct {
	Name, Namespace, ServiceAccount string
}

// Pod is one started pod's proxies.
type Pod interface {
	// Stop drains the pod's proxies at once (SPEC §8.4: ZDS Del and a
	// replaced netns drain without grace) and returns when they have ended.
	Stop()
}

// StartFunc starts one pod's proxies with every socket inside ns. It returns
// a non-nil Pod or an error; on error nothing of the pod may stay running.
// The Manager keeps ownership of ns: it closes ns after the Pod's Stop
// returns, or after a failed start is abandoned (the pod was deleted or
// replaced before a retry succeeded). Start is called from Run's goroutine,
// one pod at a time; Stops of several pods may run concurrently (on
// goroutines Run waits for), but never alongside a Start. A started pod is
// the StartFunc's to log (the Manager logs it only at debug level); a
// failed one the Manager logs.
type StartFunc func(uid string, info WorkloadInfo, ns *netns.Handle) (Pod, error)

// Pod states, as /config_dump's workloadState spells them (SPEC §8.2).
const (
	StateUp      = "Up"
	StatePending = "Pending"
)

// PodState is one pod the Manager knows.
type PodState struct {
	UID   string
	Info  WorkloadInfo
	State string // StateUp, or StatePending while Start fails and is retried
}

// DefaultPath is istio-cni's ZDS socket (INPOD_UDS's default).
const DefaultPath = "/var/run/ztunnel/ztunnel.sock"

// Config configures a Manager.
type Config struct {
	// Path is istio-cni's ZDS socket (INPOD_UDS). If empty, DefaultPath
	// is used.
	Path string
	// Start starts one pod's proxies. Required.
	Start StartFunc
	// Logger logs connection changes at info, each request at debug and
	// failures at warn or error. If nil, nothing is logged.
	Logger *slog.Logger
	// Registerer receives the four workload_manager_* series of SPEC §7.2
	// at New, so they read 0 before anything happens. If nil, no metrics
	// are registered.
	Registerer prometheus.Registerer
	// OnReady is called, from Run's goroutine, on every change of Ready;
	// it must not block. It may be nil.
	OnReady func(ready bool)
	// AfterAck, if not nil, is called from Run's goroutine once an Ack has
	// gone out while the connection is past its snapshot: after
	// SnapshotSent's Ack (for every pod of the snapshot at once) and after
	// each later request's. It must not block. Work that istio-cni need not
	// wait for, such as fetching a new pod's certificate, belongs here
	// rather than in Start, where it would compete with the Adds that hold
	// pods' start-up (a snapshot's 110 Adds above all).
	AfterAck func()
	// RetryInterval is how often a pending pod's Start is retried. If
	// zero, 5s is used.
	RetryInterval time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay, which doubles
	// after every failed attempt. If zero, 10ms and 15s are used.
	MinBackoff, MaxBackoff time.Duration
}

func (c *Config) path() string {
	if c.Path == "" {
		return DefaultPath
	}
	return c.Path
}

func (c *Config) retryInterval() time.Duration {
	if c.RetryInterval <= 0 {
		return 5 * time.Second
	}
	return c.RetryInterval
}

func (c *Config) backoff() backoff {
	b := backoff{min: c.MinBackoff, max: c.MaxBackoff}
	if b.min <= 0 {
		b.min = 10 * time.Millisecond
	}
	if b.max <= 0 {
		b.max = 15 * time.Second
	}
	return b
}

// Manager keeps the pods istio-cni hands over in sync with their proxies.
//
// Invariants and ownership:
//   - Run's goroutine owns the connection, the per-connection snapshot
//     state and every change to pods; it alone calls Start and Stop, never
//     with mu held.
//   - pods is written under mu, only by Run's goroutine, which also reads
//     it without mu; Pods reads it under mu.
//   - A pod in pods owns its netns.Handle; whoever removes the pod from pods
//     stops it and then closes the handle.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	running atomic.Bool
	ready   atomic.Bool // stored only by Run's goroutine

	mu   sync.Mutex
	pods map[string]*pod
	// status is the connection's state for Status; guarded by mu, written
	// by Run's goroutine.
	status Status

	// Owned by Run's goroutine.
	sess  *session    // current connection, or nil while disconnected
	retry *time.Timer // fires at the earliest pending pod's retryAt
}

// New returns a Manager for cfg and registers its metrics. It does not
// connect; Run does.
func New(cfg Config) (*Manager, error) {
	if cfg.Start == nil {
		return nil, errNoStart
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, log: log, metrics: met, pods: make(map[string]*pod)}, nil
}

// Ready reports whether the Manager is connected to istio-cni, has
// processed this connection's snapshot, and has no pending pod (SPEC §8.3,
// the "workload proxy manager" blocker).
func (m *Manager) Ready() bool { return m.ready.Load() }

// Status is the state of the connection to istio-cni, for the admin live
// view.
type Status struct {
	// Connected reports whether the Manager is connected now.
	Connected bool
	// Since is when Connected last changed (the first attempt's outcome
	// counts as a change); zero before the first attempt.
	Since time.Time
	// LastError is how the last connection failed or ended, or "".
	LastError string
}

// Status returns the state of the connection to istio-cni now.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status
}

// setStatus records a connection (connected) or its failure or end (err).
func (m *Manager) setStatus(connected bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.status.Since.IsZero() || m.status.Connected != connected {
		m.status.Connected, m.status.Since = connected, time.Now()
	}
	if err != nil {
		m.status.LastError = err.Error()
	}
}

// Pods returns the pods the Manager knows, sorted by uid.
func (m *Manager) Pods() []PodState {
	m.mu.Lock()
	out := make([]PodState, 0, len(m.pods))
	for _, p := range m.pods {
		out = append(out, PodState{UID: p.uid, Info: p.info, State: p.stateLocked()})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b PodState) int { return strings.Compare(a.UID, b.UID) })
	return out
}

// Run connects to istio-cni and serves it, reconnecting with backoff, until
// ctx is done (it then returns nil) or istio-cni breaks the protocol (it
// NACKs, then returns an error wrapping ErrProtocol). Either way it first
// stops every pod, draining at once, and waits for every goroutine it
// started. A Start in progress when ctx is done is waited for. Run may be
// called once.
func (m *Manager) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errRunTwice
	}
	m.retry = time.NewTimer(time.Hour)
	m.retry.Stop()
	defer m.retry.Stop()
	err := m.loop(ctx)
	m.removeAll(m.sortedPods())
	return err
}

// loop is Run's connect-serve-reconnect cycle.
func (m *Manager) loop(ctx context.Context) error {
	bo := m.cfg.backoff()
	for {
		s, err := m.connect(ctx)
		if err == nil {
			err = m.serve(ctx, s)
			m.disconnect(s)
			if s.snapshotDone {
				// Back off from scratch only after a useful connection, so a
				// peer that keeps failing us early is not hammered at 10ms.
				bo.reset()
			}
		}
		m.setStatus(false, err)
		switch {
		case errors.Is(err, ErrProtocol):
			m.log.Error("istio-cni broke the zds protocol; stopping the workload manager", "err", err)
			return err
		case errors.Is(err, errors.ErrUnsupported):
			return err
		case ctx.Err() != nil:
			return nil
		}
		d := bo.next()
		if s == nil {
			m.log.Warn("cannot connect to istio-cni", "path", m.cfg.path(), "err", err, "retry_in", d)
		} else {
			m.log.Info("disconnected from istio-cni", "path", m.cfg.path(), "err", err, "retry_in", d)
		}
		if !m.wait(ctx, d) {
			return nil
		}
	}
}

// wait sleeps for d while retrying pending pods; it reports whether d
// passed before ctx was done.
func (m *Manager) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-m.retry.C:
			m.retryPending()
		}
	}
}

// session is one connection to istio-cni and its snapshot state.
type session struct {
	conn *zdsConn
	msgs chan datagram // from readLoop; read until closed
	log  *slog.Logger

	snapshotDone bool
	named        map[string]bool // uids named by Add or Keep before SnapshotSent
}

// connect dials istio-cni and says hello (SPEC §9, step 1).
func (m *Manager) connect(ctx context.Context) (*session, error) {
	c, err := dialZDS(ctx, m.cfg.path())
	if err != nil {
		return nil, err
	}
	if err := c.send(&zdsapi.ZdsHello{Version: zdsapi.Version_V1}); err != nil {
		c.close()
		return nil, err
	}
	s := &session{conn: c, msgs: make(chan datagram), log: m.log, named: make(map[string]bool)}
	go readLoop(c, s.msgs)
	m.sess = s
	m.setStatus(true, nil)
	m.log.Info("connected to istio-cni", "path", m.cfg.path())
	return s, nil
}

// disconnect closes s and waits for its reader, closing the descriptors of
// anything still unread.
func (m *Manager) disconnect(s *session) {
	s.conn.close()
	for d := range s.msgs {
		d.closeFiles()
	}
	m.sess = nil
	m.updateReady()
}

// serve handles requests on s until the connection fails, a request ends
// it, or ctx is done.
func (m *Manager) serve(ctx context.Context, s *session) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-s.msgs:
			if !ok {
				return errConnFinished
			}
			if err := m.handle(s, d); err != nil {
				return err
			}
		case <-m.retry.C:
			m.retryPending()
		}
	}
}

// handle answers one datagram with exactly one Ack. It returns an error if
// the connection must end: a failed read, a message it cannot decode, a
// descriptor error, or a protocol error.
func (m *Manager) handle(s *session, d datagram) error {
	if d.err != nil {
		d.closeFiles()
		return d.err // io.EOF when istio-cni hung up
	}
	req, err := decodeRequest(d)
	if err != nil {
		d.closeFiles()
		s.log.Warn("bad zds message; reconnecting", "err", err)
		s.ack(err.Error()) // best effort: the connection ends anyway
		return err
	}
	nack, err := m.dispatch(s, req, d.files)
	if nack != "" {
		s.log.Warn("zds request failed", "request", requestKind(req), "err", nack)
	}
	if werr := s.ack(nack); werr != nil && err == nil {
		err = werr
	}
	if err == nil && s.snapshotDone && m.cfg.AfterAck != nil {
		m.cfg.AfterAck()
	}
	return err
}

// ack sends the one response to a request; an empty msg is success.
func (s *session) ack(msg string) error {
	return s.conn.send(&zdsapi.WorkloadResponse{
		Payload: &zdsapi.WorkloadResponse_Ack{Ack: &zdsapi.Ack{Error: msg}},
	})
}

// updateReady recomputes Ready and reports a change to OnReady.
func (m *Manager) updateReady() {
	ready := m.sess != nil && m.sess.snapshotDone && !m.anyPending()
	if m.ready.Swap(ready) != ready {
		m.log.Info("workload manager readiness changed", "ready", ready)
		if m.cfg.OnReady != nil {
			m.cfg.OnReady(ready)
		}
	}
}
