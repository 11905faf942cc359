package inpod

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gozt/gozt/proxy/netns"
)

// pod is one pod the Manager knows: running (proxy set) or pending (Start
// failed; retried at retryAt).
type pod struct {
	uid  string
	info WorkloadInfo
	ns   *netns.Handle

	// proxy is written under Manager.mu by Run's goroutine; nil while
	// pending.
	proxy Pod
	// retryAt is owned by Run's goroutine.
	retryAt time.Time
}

// stateLocked returns the pod's /config_dump state. Manager.mu must be held
// (or the caller is Run's goroutine).
func (p *pod) stateLocked() string {
	if p.proxy == nil {
		return StatePending
	}
	return StateUp
}

// callStart calls Config.Start, turning a nil Pod into an error.
func (m *Manager) callStart(p *pod) (Pod, error) {
	proxy, err := m.cfg.Start(p.uid, p.info, p.ns)
	if err == nil && proxy == nil {
		err = errNilPod
	}
	if err != nil {
		return nil, err
	}
	return proxy, nil
}

// start starts a new pod in ns, which it owns from now on. On failure the
// pod is kept pending and start returns Start's error.
func (m *Manager) start(uid string, info WorkloadInfo, ns *netns.Handle) error {
	p := &pod{uid: uid, info: info, ns: ns}
	proxy, err := m.callStart(p)
	if err != nil {
		p.retryAt = time.Now().Add(m.cfg.retryInterval())
		m.log.Warn("cannot start pod proxies; will retry", "uid", uid, "name", info.Name,
			"namespace", info.Namespace, "err", err, "retry_in", m.cfg.retryInterval())
	} else {
		// At debug: the StartFunc logs the started pod (shared mode's
		// with its identity), so that a pod's start is one line, not two,
		// and one write(2) less on each Add.
		m.log.Debug("pod proxies started", "uid", uid, "name", info.Name, "namespace", info.Namespace)
	}
	m.mu.Lock()
	p.proxy = proxy
	m.pods[uid] = p
	m.setGaugesLocked()
	m.mu.Unlock()
	if err == nil {
		m.metrics.started.Inc()
	}
	m.armRetry()
	m.updateReady()
	return err
}

// retryPending retries Start for every pending pod that is due.
func (m *Manager) retryPending() {
	now := time.Now()
	for _, p := range m.sortedPods() {
		if p.proxy != nil || p.retryAt.After(now) {
			continue
		}
		proxy, err := m.callStart(p)
		if err != nil {
			p.retryAt = time.Now().Add(m.cfg.retryInterval())
			m.log.Warn("cannot start pod proxies; will retry", "uid", p.uid, "err", err,
				"retry_in", m.cfg.retryInterval())
			continue
		}
		m.log.Info("pod proxies started after retry", "uid", p.uid)
		m.mu.Lock()
		p.proxy = proxy
		m.setGaugesLocked()
		m.mu.Unlock()
		m.metrics.started.Inc()
	}
	m.armRetry()
	m.updateReady()
}

// removeAll forgets ps, stops their proxies (at once, concurrently) and
// closes their namespaces.
func (m *Manager) removeAll(ps []*pod) {
	if len(ps) == 0 {
		return
	}
	m.mu.Lock()
	for _, p := range ps {
		delete(m.pods, p.uid)
	}
	m.setGaugesLocked()
	m.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range ps {
		if p.proxy != nil {
			wg.Go(p.proxy.Stop)
		}
	}
	wg.Wait()
	for _, p := range ps {
		p.ns.Close()
		if p.proxy != nil {
			m.metrics.stopped.Inc()
			m.log.Info("pod proxies stopped", "uid", p.uid)
		} else {
			m.log.Info("pending pod dropped", "uid", p.uid)
		}
	}
	m.armRetry()
	m.updateReady()
}

// setGaugesLocked sets the active and pending gauges from pods. m.mu must
// be held.
func (m *Manager) setGaugesLocked() {
	var up, pending int
	for _, p := range m.pods {
		if p.proxy != nil {
			up++
		} else {
			pending++
		}
	}
	m.metrics.active.Set(float64(up))
	m.metrics.pending.Set(float64(pending))
}

// armRetry sets the retry timer to the earliest pending pod's retryAt, or
// stops it if no pod is pending.
func (m *Manager) armRetry() {
	var next time.Time
	for _, p := range m.pods {
		if p.proxy == nil && (next.IsZero() || p.retryAt.Before(next)) {
			next = p.retryAt
		}
	}
	if next.IsZero() {
		m.retry.Stop()
		return
	}
	m.retry.Reset(max(time.Until(next), 0))
}

// anyPending reports whether a pod is pending. Run's goroutine only.
func (m *Manager) anyPending() bool {
	for _, p := range m.pods {
		if p.proxy == nil {
			return true
		}
	}
	return false
}

// sortedPods returns every pod sorted by uid. Run's goroutine only.
func (m *Manager) sortedPods() []*pod {
	ps := make([]*pod, 0, len(m.pods))
	for _, p := range m.pods {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *pod) int { return strings.Compare(a.uid, b.uid) })
	return ps
}
