package node

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/cmd/gozt/internal/admin"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/state"
)

// blockPods is the readiness blocker of shared mode (SPEC §8.3): set until
// the ZDS snapshot is processed with no pending pod, and again whenever the
// connection to istio-cni drops.
const blockPods = "workload proxy manager"

// pods are the per-pod proxies of shared mode, one set of listeners in each
// ambient pod's network namespace, as istio-cni hands them over (SPEC §1.3,
// §9).
type pods struct {
	n   *Node
	mgr *inpod.Manager

	mu      sync.Mutex
	running map[string]*podProxy      // by ZDS uid
	ids     map[identity.Identity]int // running pods per identity, for prefetch
	fetch   []identity.Identity       // identities to prefetch once istio-cni has its Acks
}

// podProxy is one pod's proxy; it implements inpod.Pod.
type podProxy struct {
	pods *pods
	uid  string
	info inpod.WorkloadInfo
	id   identity.Identity
	p    *proxy.Proxy // started (Start): Shutdown waits for its loops
}

func newPods(n *Node) (*pods, error) {
	if err := checkPrivileges(n.opts.Env.PacketMark); err != nil {
		return nil, err
	}
	ps := &pods{n: n, running: make(map[string]*podProxy), ids: make(map[identity.Identity]int)}
	mgr, err := inpod.New(inpod.Config{
		Path:       n.opts.Env.InpodUDS,
		Start:      ps.start,
		Logger:     n.log.With("scope", "inpod"),
		Registerer: n.registry,
		AfterAck:   ps.prefetch,
		OnReady: func(ready bool) {
			if ready {
				n.ready.Unblock(blockPods)
			} else {
				n.ready.Block(blockPods)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("INPOD_UDS: %w", err)
	}
	ps.mgr = mgr
	return ps, nil
}

// checkPrivileges fails start-up unless gozt can enter a network namespace
// and mark its sockets, as ztunnel checks at start in shared mode (SPEC §9).
func checkPrivileges(mark uint32) error {
	// The process's own namespace, opened from a thread known to be in it
	// (/proc/self is the main thread, which a locked goroutine may have
	// moved into a pod's namespace).
	home, err := netns.Home()
	if err != nil {
		return fmt.Errorf("shared mode: %w", err)
	}
	self, err := netns.New(home)
	if err != nil {
		return fmt.Errorf("shared mode: %w", err)
	}
	defer self.Close()
	err = self.Run(func() error {
		lc := sockopt.ListenConfig(sockopt.Options{Mark: mark})
		l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		return l.Close()
	})
	if err != nil {
		return fmt.Errorf("shared mode needs CAP_SYS_ADMIN (setns into pod network namespaces) and CAP_NET_ADMIN (SO_MARK %d): %w", mark, err)
	}
	return nil
}

// start is the inpod.StartFunc: it binds the pod's listeners inside its
// network namespace and serves them. The pod's local workload is found among
// the xDS workloads of this node by the ZDS name, namespace and service
// account, as dedicated mode finds its own; connections wait for it.
func (ps *pods) start(uid string, info inpod.WorkloadInfo, ns *netns.Handle) (inpod.Pod, error) {
	n := ps.n
	// The closure keeps the node's name, not a copy of the whole
	// environment (most of a kilobyte per pod).
	nodeName := n.opts.Env.NodeName
	find := func(s *state.Snapshot) *state.Workload {
		return s.FindWorkload(nodeName, info.Namespace, info.Name, info.ServiceAccount)
	}
	// Listeners bind the unspecified address inside the pod's namespace.
	p, err := proxy.New(n.proxyConfig(envconfig.Workload{UID: uid, Local: find, InNetns: ns.Enter}))
	if err != nil {
		return nil, err
	}
	if err := p.Listen(context.Background()); err != nil {
		return nil, err
	}
	pp := &podProxy{pods: ps, uid: uid, info: info, id: ps.identity(info), p: p}
	p.Start()
	ps.mu.Lock()
	ps.running[uid] = pp
	if ps.ids[pp.id]++; ps.ids[pp.id] == 1 {
		ps.fetch = append(ps.fetch, pp.id)
	}
	ps.mu.Unlock()
	n.log.Info("pod proxy started", "uid", uid, "namespace", info.Namespace, "name", info.Name, "identity", pp.id.String())
	return pp, nil
}

// prefetch asks for the certificates of pods started since it last ran
// whose identity still has a running pod. It is inpod's AfterAck, so a pod's
// certificate is fetched once istio-cni has the pod's Ack, or for the
// pods of a snapshot once it has SnapshotSent's: the CSRs (a key, a
// signature, a round trip each) then no longer compete with the Adds that
// hold pods' start-up (bench/NOTES.md, the node scenario).
func (ps *pods) prefetch() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, id := range ps.fetch {
		if ps.ids[id] > 0 {
			ps.n.certs.Prefetch(id)
		}
	}
	ps.fetch = ps.fetch[:0]
}

// identity is the SPIFFE identity of a pod: its service account in the trust
// domain xDS gives its workload, else TRUST_DOMAIN.
func (ps *pods) identity(info inpod.WorkloadInfo) identity.Identity {
	env := ps.n.opts.Env
	if w := ps.n.store.Snapshot().FindWorkload(env.NodeName, info.Namespace, info.Name, info.ServiceAccount); w != nil {
		return w.Identity()
	}
	sa := info.ServiceAccount
	if sa == "" {
		sa = state.DefaultServiceAccount
	}
	return identity.Identity{TrustDomain: env.TrustDomain, Namespace: info.Namespace, ServiceAccount: sa}
}

// Stop drains the pod's proxy at once (SPEC §8.4: a deleted pod gets no
// grace period) and forgets its certificate when no other pod shares it.
func (pp *podProxy) Stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = pp.p.Shutdown(ctx) // returns once every loop and connection has ended
	ps := pp.pods
	ps.mu.Lock()
	if ps.running[pp.uid] == pp {
		delete(ps.running, pp.uid)
	}
	if ps.ids[pp.id]--; ps.ids[pp.id] <= 0 {
		delete(ps.ids, pp.id)
		ps.n.certs.Forget(pp.id)
	}
	ps.mu.Unlock()
	ps.n.log.Info("pod proxy stopped", "uid", pp.uid, "namespace", pp.info.Namespace, "name", pp.info.Name)
}

// shutdown drains every pod's proxy until ctx is done, as SIGTERM drains
// dedicated mode's one proxy (SPEC §8.4: in shared mode all per-pod proxies
// drain this way). The inpod manager, stopped after this, finds them ended.
func (ps *pods) shutdown(ctx context.Context) {
	ps.mu.Lock()
	all := make([]*podProxy, 0, len(ps.running))
	for _, pp := range ps.running {
		all = append(all, pp)
	}
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, pp := range all {
		wg.Go(func() { _ = pp.p.Shutdown(ctx) })
	}
	wg.Wait()
}

// handedOver returns every pod istio-cni handed over, as the manager lists
// it, and a copy of the running proxies by ZDS uid, taken after the list.
func (ps *pods) handedOver() ([]inpod.PodState, map[string]*podProxy) {
	states := ps.mgr.Pods()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return states, maps.Clone(ps.running)
}

// workloadState is /config_dump's workloadState: every pod istio-cni handed
// over, Up or Pending, with the live connections of those that are up.
func (ps *pods) workloadState() map[string]admin.WorkloadState {
	states, running := ps.handedOver()
	out := make(map[string]admin.WorkloadState, len(states))
	for _, st := range states {
		ws := admin.WorkloadState{
			State: st.State,
			Info: admin.WorkloadInfo{Name: st.Info.Name, Namespace: st.Info.Namespace,
				TrustDomain: ps.identity(st.Info).TrustDomain, ServiceAccount: st.Info.ServiceAccount},
			Connections: admin.NoConnections(),
		}
		if pp := running[st.UID]; pp != nil {
			ws.Connections = admin.ConnectionsOf(pp.p)
		}
		out[st.UID] = ws
	}
	return out
}

// selfProxy serves gozt's own identity on 15008 in gozt's own network
// namespace, so mesh clients reach gozt's endpoints (metrics, say) over
// HBONE with policy applied (SPEC §1.3). It exists in shared mode when
// POD_NAME, POD_NAMESPACE and SERVICE_ACCOUNT are all set, starts after the
// first xDS sync, and never preserves the client's source IP.
func (n *Node) selfProxy(ctx context.Context) error {
	env := n.opts.Env
	if n.xds != nil {
		select {
		case <-n.xds.Ready():
		case <-ctx.Done():
			return nil
		}
	}
	find := func(s *state.Snapshot) *state.Workload {
		return s.FindWorkload(env.NodeName, env.PodNamespace, env.PodName, env.ServiceAccount)
	}
	cfg := n.proxyConfig(envconfig.Workload{UID: "self", Local: find, BindAddr: n.opts.BindAddr})
	cfg.InboundOnly = true
	cfg.Spoof = proxy.SpoofOff
	cfg.ListConnections = false
	p, err := proxy.New(cfg)
	if err != nil {
		return err
	}
	if err := p.Listen(ctx); err != nil {
		return fmt.Errorf("self-proxy: %w", err)
	}
	n.log.Info("self-proxy listening", "addr", p.Addrs()["inbound"].String())
	served := make(chan error, 1)
	go func() { served <- p.Serve() }()
	n.self.Store(p) // Shutdown drains it with the pods
	<-ctx.Done()
	dctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p.Shutdown(dctx)
	return <-served
}
