// Package node wires `gozt proxy`: the node proxy configured by ztunnel's
// environment variables, with workloads and policies from istiod's delta xDS
// and certificates from istiod's CA. Dedicated mode (one workload, listeners
// in gozt's own network namespace) is supported; shared (in-pod) mode is not
// yet. Only cmd/gozt imports it.
package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/istioca"
	"github.com/gozt/gozt/cmd/gozt/internal/admin"
	"github.com/gozt/gozt/cmd/gozt/internal/explain"
	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/internal/runner"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
)

// Readiness blockers (SPEC §8.3).
const (
	blockState = "state manager"
	blockProxy = "proxy"
)

// Options configures a node proxy.
type Options struct {
	Env envconfig.Config
	// AdminAddr, MetricsAddr, ReadinessAddr: if empty 127.0.0.1:15000,
	// [::]:15020 (0.0.0.0 without IPv6) and [::]:15021.
	AdminAddr, MetricsAddr, ReadinessAddr string
	// BindAddr is the address the workload listeners bind to; if invalid,
	// the unspecified address ([::], or 0.0.0.0 without IPv6). A gozt
	// addition: tests run several dedicated proxies on loopback IPs.
	// Shared mode ignores it: pod listeners bind the unspecified address
	// inside each pod's network namespace.
	BindAddr netip.Addr
	// OutboundSource, if valid, binds outbound sockets (as local mode does).
	OutboundSource netip.Addr
	Logger         *slog.Logger
	Levels         *logscope.Levels
	// MemoryLimit is the memory limit in force, in bytes (the lower of
	// GOMEMLIMIT and the cgroup's), against which admission control
	// refuses new connections under memory pressure (admission.Controller);
	// zero turns that off. main sets it.
	MemoryLimit int64

	// ResolvConf is the resolv.conf of the DNS proxy's upstream servers and
	// search list; if empty /etc/resolv.conf, as ztunnel reads its own. A
	// gozt addition for tests.
	ResolvConf string
}

// Node is a running node proxy.
type Node struct {
	opts  Options
	log   *slog.Logger
	store *state.Store
	certs *certs.Manager
	ca    *istioca.Client
	xds   *xds.Client
	// svc are the services every proxy shares (metrics, admission,
	// connection manager, DNS and host resolvers, denials); each proxy's
	// Certs is a view of certs limited to its own workload (proxyConfig).
	svc envconfig.Services
	// proxy is dedicated mode's one proxy; pods are shared mode's.
	proxy *proxy.Proxy
	pods  *pods
	self  atomic.Pointer[proxy.Proxy] // shared mode's self-proxy, once it listens
	crl   *certs.CRL                  // CRL_PATH's lists, or nil
	// findLocal finds the workload this dedicated proxy serves.
	findLocal func(*state.Snapshot) *state.Workload
	ready     *admin.Readiness
	ports     *admin.Ports
	registry  *prometheus.Registry
	quit      chan struct{}
	quitOnce  sync.Once
	run       *runner.Runner
}

// Start builds every component from opts.Env, binds the listeners and
// starts serving. In dedicated mode the workload listeners accept at once;
// connections wait (up to 5s) for xDS to deliver the local workload. In
// shared mode gozt connects to istio-cni (INPOD_UDS) and opens each pod's
// listeners inside the pod's network namespace as istio-cni hands it over.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	shared := opts.Env.ProxyMode == envconfig.ModeShared
	n = &Node{opts: opts, log: opts.Logger, quit: make(chan struct{}), registry: prometheus.NewRegistry()}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		admin.BuildInfo(opts.Env.IstioVersion))
	n.svc = opts.Env.NewServices(envconfig.Process{
		Registry: n.registry, ResolvConf: opts.ResolvConf, MemoryLimit: opts.MemoryLimit, Logger: n.log,
	})
	// The xDS series read 0 before (or without) an xDS stream; the client
	// reuses them. Shared mode's inpod.Manager registers the workload
	// manager series itself; dedicated mode has none, so they read 0.
	if err := xds.RegisterMetrics(n.registry); err != nil {
		return nil, err
	}
	if !shared {
		if err := inpod.RegisterMetrics(n.registry); err != nil {
			return nil, err
		}
	}
	env := opts.Env
	n.findLocal = func(s *state.Snapshot) *state.Workload {
		return s.FindWorkload(env.NodeName, env.WorkloadNamespace, env.WorkloadName, env.WorkloadServiceAccount)
	}
	var hook *certHook
	n.store = state.NewStore(state.Config{OnUpdate: func(prev, next *state.Snapshot) {
		n.svc.ConnMgr.Notify(next)
		if hook != nil {
			hook.update(prev, next)
		}
	}})
	n.svc.Store = n.store
	if shared {
		n.ready = admin.NewReadiness(blockState, blockPods)
	} else {
		n.ready = admin.NewReadiness(blockState, blockProxy)
	}
	// Readiness fails while new connections are shed for lack of file
	// descriptors or memory.
	n.svc.Admission.BlockReadiness(n.ready.BlockWhile)
	n.run = runner.New()
	built := n // the named result is nil on an error return; clean up what was built
	defer func() {
		if err != nil {
			built.closeAll()
		}
	}()
	if err := n.loadStatic(); err != nil {
		return nil, err
	}
	if err := n.buildControlPlane(); err != nil {
		return nil, err
	}
	if n.xds != nil {
		n.svc.Demand = n.xds // used with XDS_ON_DEMAND
	}
	if !shared {
		// Dedicated mode prefetches only its own workload's certificate;
		// shared mode prefetches each pod's as istio-cni hands it over.
		hook = newCertHook(n.certs, func(w state.WorkloadNames) bool {
			return w.Namespace == env.WorkloadNamespace && w.Name == env.WorkloadName &&
				w.Identity.ServiceAccount == orDefault(env.WorkloadServiceAccount, state.DefaultServiceAccount)
		})
		hook.update(nil, n.store.Snapshot())
	}
	if err := n.startSidePorts(ctx); err != nil {
		return nil, err
	}
	if shared {
		if n.pods, err = newPods(n); err != nil {
			return nil, err
		}
	} else if err := n.startProxy(ctx); err != nil {
		return nil, err
	}
	n.start()
	return n, nil
}

// loadStatic applies LOCAL_XDS_PATH / LOCAL_XDS (SPEC §5.5).
func (n *Node) loadStatic() error {
	env := n.opts.Env
	var cfg *xds.LocalConfig
	var err error
	switch {
	case env.LocalXDSPath != "":
		cfg, err = xds.LoadLocalConfig(env.LocalXDSPath)
	case env.LocalXDS != "":
		cfg, err = xds.ParseLocalConfig("LOCAL_XDS", []byte(env.LocalXDS))
	default:
		return nil
	}
	if err != nil {
		return err
	}
	var applyErr error
	n.store.Update(func(b *state.Batch) { applyErr = cfg.Apply(b) })
	return applyErr
}

// buildControlPlane creates the CA client, the certificate manager and the
// xDS client from the environment.
func (n *Node) buildControlPlane() error {
	env := n.opts.Env
	token, err := tokenSource(env)
	if err != nil {
		return err
	}
	caTLS, err := controlPlaneTLS("CA_ROOT_CA", env.CARootCA, env.CAAddress, env.AltCAHostname, env.TLSPolicy())
	if err != nil {
		return err
	}
	n.ca, err = istioca.New(istioca.Config{
		Address:   env.CAAddress,
		TLS:       caTLS,
		Token:     token,
		ClusterID: env.ClusterID,
		Headers:   env.CAHeaders,
		TTL:       env.SecretTTL,
		// Shared mode asks for each pod's identity on its behalf (SPEC §6.2).
		Impersonate: env.ProxyMode == envconfig.ModeShared,
	})
	if err != nil {
		return fmt.Errorf("CA_ADDRESS: %w", err)
	}
	n.crl = n.loadCRL()
	n.certs = certs.NewManager(certs.ManagerConfig{
		Issuer: n.ca, Logger: n.log.With("scope", "certs"), CRL: n.crl, RootGrace: env.RootRotationGrace,
	})
	n.registry.MustRegister(admin.NewCertExpiry(n.certs.States))
	if env.XDSAddress == "" {
		n.ready.Unblock(blockState)
		return nil
	}
	xdsTLS, err := controlPlaneTLS("XDS_ROOT_CA", env.XDSRootCA, env.XDSAddress, env.AltXDSHostname, env.TLSPolicy())
	if err != nil {
		return err
	}
	n.xds, err = xds.NewClient(xds.Config{
		Address:   env.XDSAddress,
		TLS:       xdsTLS,
		Token:     token,
		ClusterID: env.ClusterID,
		Headers:   env.XDSHeaders,
		Node: xds.BuildNode(xds.NodeInfo{
			InstanceIP: env.InstanceIP, PodName: env.PodName, PodNamespace: env.PodNamespace,
			NodeName: env.NodeName, Meta: env.Meta, MetaJSON: env.MetaJSON,
		}),
		Store:   n.store,
		Logger:  n.log.With("scope", "xds"),
		Metrics: n.registry,
		// XDS_ON_DEMAND; a demand waits at most the xDS connect
		// timeout (xds.Config.DemandTimeout).
		OnDemand: env.XDSOnDemand,
		// gozt owns the process: a large push may relax its collector and
		// run at low priority (xds.Config.TunePushes).
		TunePushes: true,
	})
	if err != nil {
		return fmt.Errorf("XDS_ADDRESS: %w", err)
	}
	return nil
}

// tokenSource is AUTH_TOKEN: a file re-read on every request, a static
// token, or nothing.
func tokenSource(env envconfig.Config) (func() (string, error), error) {
	switch {
	case env.AuthToken == "":
		return nil, nil
	case env.AuthTokenIsFile:
		return istioca.TokenFile(env.AuthToken), nil
	default:
		tok := env.AuthToken
		return func() (string, error) { return tok, nil }, nil
	}
}

// controlPlaneTLS builds the TLS config for istiod from a root setting
// (path, SYSTEM, or inline PEM) and the address's host name.
func controlPlaneTLS(name, rootSetting, address, alt string, policy certs.Policy) (*tls.Config, error) {
	roots, err := rootSource(name, rootSetting)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(address)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	// ztunnel's control plane takes the same versions and key exchanges as
	// HBONE (TLS12_ENABLED, COMPLIANCE_POLICY).
	return policy.Apply(istioca.TLSConfig(roots, u.Hostname(), alt)), nil
}

// rootSource resolves XDS_ROOT_CA / CA_ROOT_CA (SPEC §0.3): an existing
// path is read on every handshake (so a rotated file takes effect); SYSTEM
// means the OS roots; anything else must be inline PEM.
func rootSource(name, v string) (func() (*x509.CertPool, error), error) {
	if v == "SYSTEM" {
		return x509.SystemCertPool, nil
	}
	if _, err := os.Stat(v); err == nil {
		return func() (*x509.CertPool, error) {
			data, err := os.ReadFile(v)
			if err != nil {
				return nil, err
			}
			return istioca.RootPool(data)
		}, nil
	}
	pool, err := istioca.RootPool([]byte(v))
	if err != nil {
		return nil, fmt.Errorf("%s: %q is neither a readable file, SYSTEM, nor PEM certificates", name, truncate(v))
	}
	return func() (*x509.CertPool, error) { return pool, nil }, nil
}

// portOr is p as a string, or def when p is zero.
func portOr(p, def uint16) string {
	if p == 0 {
		p = def
	}
	return strconv.Itoa(int(p))
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func (n *Node) startSidePorts(ctx context.Context) (err error) {
	wild := "[::]"
	if !n.opts.Env.IPv6Enabled {
		wild = "0.0.0.0"
	}
	n.ports, err = admin.ListenAll(ctx, admin.Addrs{
		// ProxyConfig's proxyAdminPort and statsPort, as ztunnel (SPEC §0.3).
		Admin:     orDefault(n.opts.AdminAddr, "127.0.0.1:"+portOr(n.opts.Env.AdminPort, 15000)),
		Metrics:   orDefault(n.opts.MetricsAddr, wild+":"+portOr(n.opts.Env.StatsPort, 15020)),
		Readiness: orDefault(n.opts.ReadinessAddr, wild+":15021"),
	}, admin.Config{
		ConfigDump: func() any {
			in := admin.DumpInput{
				Snapshot: n.store.Snapshot(), Certs: n.certs.States(), Config: n.opts.Env, Version: admin.Version,
				IstioVersion: n.opts.Env.IstioVersion,
			}
			if n.pods != nil {
				in.WorkloadState = n.pods.workloadState()
			} else if n.proxy != nil {
				in.WorkloadState = n.workloadState(in.Snapshot)
			}
			return admin.ConfigDump(in)
		},
		Quit:     func() { n.quitOnce.Do(func() { close(n.quit) }) },
		Levels:   n.opts.Levels,
		Handlers: map[string]http.Handler{"/debug/authz": explain.Handler(n.store.Snapshot)},
		Live:     n.live,
	}, n.registry, n.ready)
	return err
}

// proxyConfig is the configuration of a workload proxy serving w:
// dedicated mode's one, one pod's in shared mode, or the self-proxy. Each
// gets only its own workload's certificate.
func (n *Node) proxyConfig(w envconfig.Workload) proxy.Config {
	svc := n.svc
	svc.Certs = ownCerts{certs: n.certs, store: n.store, local: w.Local}
	return n.opts.Env.Proxy(svc, w)
}

// workloadState is dedicated mode's /config_dump workloadState: its one
// workload, Up, with its live connections, keyed by the uid xDS gives it
// or, until xDS has, by PROXY_WORKLOAD_INFO's namespace/name.
func (n *Node) workloadState(snap *state.Snapshot) map[string]admin.WorkloadState {
	env := n.opts.Env
	key := env.WorkloadNamespace + "/" + env.WorkloadName
	td := env.TrustDomain
	if w := n.findLocal(snap); w != nil {
		key, td = w.UID, w.Identity().TrustDomain
	}
	return map[string]admin.WorkloadState{key: {
		State: inpod.StateUp,
		Info: admin.WorkloadInfo{Name: env.WorkloadName, Namespace: env.WorkloadNamespace, TrustDomain: td,
			ServiceAccount: orDefault(env.WorkloadServiceAccount, state.DefaultServiceAccount)},
		Connections: admin.ConnectionsOf(n.proxy),
	}}
}

// startProxy binds dedicated mode's one proxy in gozt's own network
// namespace.
func (n *Node) startProxy(ctx context.Context) error {
	p, err := proxy.New(n.proxyConfig(envconfig.Workload{
		Local: n.findLocal, BindAddr: n.opts.BindAddr, OutboundSource: n.opts.OutboundSource,
	}))
	if err != nil {
		return err
	}
	if err := p.Listen(ctx); err != nil {
		return err
	}
	n.proxy = p
	return nil
}

// start runs the background loops: certificates, connection re-checks, xDS,
// and the proxy's accept loops or the inpod manager. The first of them to
// fail stops the node (Done) and is Shutdown's error.
func (n *Node) start() {
	n.run.Go("certs", n.certs.Run)
	if n.crl != nil {
		n.run.Go("crl", n.watchCRL)
	}
	if rootFile(n.opts.Env.CARootCA) != "" {
		n.run.Go("ca root file", n.watchRoots)
	}
	n.run.Go("connmgr", n.svc.ConnMgr.Run)
	n.run.Go("admission", n.svc.Admission.Run)
	n.run.Go("metrics series", func(ctx context.Context) error { return n.svc.Metrics.SweepSeries(ctx, n.store) })
	if n.xds != nil {
		n.run.Go("xds", n.xds.Run)
		n.run.Go("xds readiness", func(ctx context.Context) error {
			select {
			case <-n.xds.Ready():
				n.ready.Unblock(blockState)
				n.log.Info("xds synced: state manager ready")
			case <-ctx.Done():
			}
			return nil
		})
	}
	if n.pods != nil {
		n.run.Go("workload proxy manager", n.pods.mgr.Run)
		if env := n.opts.Env; env.PodName != "" && env.PodNamespace != "" && env.ServiceAccount != "" {
			n.run.Go("self-proxy", n.selfProxy)
		}
		return
	}
	p := n.proxy
	n.run.Go("proxy", func(context.Context) error { return p.Serve() })
	n.ready.Unblock(blockProxy)
}

// Quit is closed when POST /quitquitquit asks for a shutdown.
func (n *Node) Quit() <-chan struct{} { return n.quit }

// Done is closed when a part of the node failed (for example a ZDS protocol
// error, SPEC §9): the process must shut down and exit 1 with Shutdown's
// error.
func (n *Node) Done() <-chan struct{} { return n.run.Failed() }

// Store is the node's mesh state.
func (n *Node) Store() *state.Store { return n.store }

// Certs is the certificate manager.
func (n *Node) Certs() *certs.Manager { return n.certs }

// Addrs returns dedicated mode's workload listener addresses by name (nil in
// shared mode, whose listeners live in the pods' network namespaces).
func (n *Node) Addrs() map[string]net.Addr {
	if n.proxy != nil {
		return n.proxy.Addrs()
	}
	return nil
}

// AdminAddr, MetricsAddr, ReadinessAddr are the bound side ports.
func (n *Node) AdminAddr() net.Addr     { return n.ports.Admin.Addr() }
func (n *Node) MetricsAddr() net.Addr   { return n.ports.Metrics.Addr() }
func (n *Node) ReadinessAddr() net.Addr { return n.ports.Readiness.Addr() }

// Shutdown drains the workload proxies until ctx is done, then stops
// everything. It returns the error that stopped the node, if one did.
func (n *Node) Shutdown(ctx context.Context) error {
	n.ready.Block("shutdown")
	var errs []error
	if n.proxy != nil {
		errs = append(errs, n.proxy.Shutdown(ctx))
	}
	var wg sync.WaitGroup
	if n.pods != nil {
		wg.Go(func() { n.pods.shutdown(ctx) })
	}
	if self := n.self.Load(); self != nil {
		wg.Go(func() { errs = append(errs, self.Shutdown(ctx)) })
	}
	wg.Wait()
	errs = append(errs, n.closeAll())
	return errors.Join(errs...)
}

// closeAll stops every part at once and returns the first failure of a
// background loop.
func (n *Node) closeAll() error {
	if n.proxy != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = n.proxy.Shutdown(ctx)
	}
	err := n.run.Stop()
	if n.ca != nil {
		n.ca.Close()
	}
	if n.ports != nil {
		n.ports.Shutdown(context.Background())
	}
	return err
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
