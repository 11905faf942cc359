// Package local wires `gozt local`: a whole mesh on one machine. Every
// workload of the local config whose IP belongs to this host gets its own
// listeners bound to that IP (as a pod gets them in its netns), certificates
// come from a built-in CA, and the admin, metrics and readiness ports serve
// the node's state. Only cmd/gozt imports it.
package local

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/cmd/gozt/internal/admin"
	"github.com/gozt/gozt/cmd/gozt/internal/explain"
	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/internal/runner"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
)

//go:embed demo.yaml
var demoConfig []byte

// DemoBackendAddr is where the demo echo backend listens.
const DemoBackendAddr = "127.0.0.3:8080"

// Options configures a local mesh. Zero values mean the documented defaults.
type Options struct {
	// ConfigPath is the local config YAML (SPEC §5.5); empty loads the
	// embedded demo and starts the demo echo backend.
	ConfigPath string
	// CADir, if set, holds the CA in Istio's cacerts layout (created if absent).
	CADir string
	// AdminAddr, MetricsAddr, ReadinessAddr: if empty 127.0.0.1:15000,
	// 127.0.0.1:15020 and 127.0.0.1:15021.
	AdminAddr, MetricsAddr, ReadinessAddr string
	// Env is the configuration from the environment (envconfig.LoadLocal,
	// whose Network main's --network may replace); nil is an empty
	// environment's.
	Env *envconfig.Config
	// IgnoreForwarded ignores the Forwarded for= of waypoints, as ztunnel
	// does (proxy.Config.IgnoreForwarded; TRUST_WAYPOINT_FORWARDED=false).
	IgnoreForwarded bool
	// CertTTL is the workload certificate lifetime; if zero 24h.
	CertTTL time.Duration
	// Logger receives logs (nil: discard); Levels, if set, are its live
	// levels, which the admin /logging endpoint changes.
	Logger *slog.Logger
	Levels *logscope.Levels
	// Out receives the start-up banner; nil means none.
	Out io.Writer
	// ResolvConf is the resolv.conf of the DNS proxy's upstream servers and
	// of the resolution of hostname endpoints; if empty /etc/resolv.conf.
	// A test seam, as node.Options.ResolvConf.
	ResolvConf string
	// MemoryLimit is the memory limit in force, in bytes (the lower of
	// GOMEMLIMIT and the cgroup's), against which admission control
	// refuses new connections under memory pressure (admission.Controller);
	// zero turns that off. main sets it.
	MemoryLimit int64
}

// Mesh is a running local mesh.
type Mesh struct {
	opts   Options
	env    envconfig.Config
	log    *slog.Logger
	store  *state.Store
	static *xds.LocalConfig
	ca     *localca.CA
	certs  *certs.Manager
	// svc are the services every proxy shares (metrics, admission,
	// connection manager, DNS and host resolvers, denials, certs).
	svc      envconfig.Services
	registry *prometheus.Registry
	proxies  []*proxy.Proxy
	ready    *admin.Readiness
	ports    *admin.Ports
	echo     *EchoServer
	quit     chan struct{}
	quitOnce sync.Once

	run *runner.Runner // the background loops
}

// Start loads the config, binds every listener and starts serving. On error
// nothing is left running.
func Start(ctx context.Context, opts Options) (m *Mesh, err error) {
	m = &Mesh{opts: opts, log: opts.Logger, quit: make(chan struct{}), run: runner.New(), registry: prometheus.NewRegistry()}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if opts.Env != nil {
		m.env = *opts.Env
	} else if m.env, err = envconfig.LoadLocal(nil); err != nil {
		return nil, err
	}
	if opts.ConfigPath == "" {
		m.static, err = xds.ParseLocalConfig("demo.yaml", demoConfig)
	} else {
		m.static, err = xds.LoadLocalConfig(opts.ConfigPath)
	}
	if err != nil {
		return nil, err
	}
	m.svc = m.env.NewServices(envconfig.Process{
		Registry: m.registry, ResolvConf: opts.ResolvConf, MemoryLimit: opts.MemoryLimit, Logger: m.log,
	})
	m.store = state.NewStore(state.Config{OnUpdate: func(_, next *state.Snapshot) { m.svc.ConnMgr.Notify(next) }})
	m.svc.Store = m.store
	var applyErr error
	m.store.Update(func(b *state.Batch) { applyErr = m.static.Apply(b) })
	if applyErr != nil {
		return nil, applyErr
	}
	m.ca, err = localca.New(localca.Config{Dir: opts.CADir, TTL: opts.CertTTL})
	if err != nil {
		return nil, err
	}
	m.certs = certs.NewManager(certs.ManagerConfig{Issuer: m.ca, Logger: m.log.With("scope", "certs")})
	m.svc.Certs = m.certs
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(admin.BuildInfo("unknown"), admin.NewCertExpiry(m.certs.States))
	// Local mode runs no xDS client and no workload manager; their series
	// read 0 so that every dashboard panel shows 0, not "No data".
	if err := xds.RegisterMetrics(m.registry); err != nil {
		return nil, err
	}
	if err := inpod.RegisterMetrics(m.registry); err != nil {
		return nil, err
	}
	m.ready = admin.NewReadiness("proxy")
	m.svc.Admission.BlockReadiness(m.ready.BlockWhile)

	built := m // the named result is nil on an error return; clean up what was built
	defer func() {
		if err != nil {
			built.closeAll()
		}
	}()
	if err := m.startSidePorts(ctx); err != nil {
		return nil, err
	}
	if err := m.startProxies(ctx); err != nil {
		return nil, err
	}
	if opts.ConfigPath == "" {
		if m.echo, err = ListenEcho(DemoBackendAddr); err != nil {
			return nil, err
		}
	}
	m.run.Go("certs", m.certs.Run)
	m.run.Go("connmgr", m.svc.ConnMgr.Run)
	m.run.Go("admission", m.svc.Admission.Run)
	for _, p := range m.proxies {
		m.run.Go("proxy "+p.UID(), func(context.Context) error { return p.Serve() })
	}
	m.ready.Unblock("proxy")
	m.banner()
	return m, nil
}

func (m *Mesh) startSidePorts(ctx context.Context) (err error) {
	m.ports, err = admin.ListenAll(ctx, admin.Addrs{
		Admin:     orDefault(m.opts.AdminAddr, "127.0.0.1:15000"),
		Metrics:   orDefault(m.opts.MetricsAddr, "127.0.0.1:15020"),
		Readiness: orDefault(m.opts.ReadinessAddr, "127.0.0.1:15021"),
	}, admin.Config{
		ConfigDump: func() any {
			snap := m.store.Snapshot()
			return admin.ConfigDump(admin.DumpInput{
				Snapshot: snap, Static: m.static.Raw, Certs: m.certs.States(),
				Config: m.dumpConfig(), Version: admin.Version, IstioVersion: "unknown",
				WorkloadState: m.workloadState(snap),
			})
		},
		Quit:     m.signalQuit,
		Levels:   m.opts.Levels,
		Handlers: map[string]http.Handler{"/debug/authz": explain.Handler(m.store.Snapshot)},
		Live:     m.live,
	}, m.registry, m.ready)
	return err
}

// live is what the admin live view shows: every proxied workload, its
// connections and denials, the static config and the built-in CA.
func (m *Mesh) live() admin.LiveInput {
	snap := m.store.Snapshot()
	in := admin.LiveInput{Mode: "local", Certs: m.certs.States(), ConnsListed: true,
		XDS: &admin.Link{State: admin.LinkStatic, Address: orDefault(m.opts.ConfigPath, "embedded demo config")}}
	for _, p := range m.proxies {
		in.AddWorkload(snap.WorkloadByUID(p.UID()), "")
		in.AddConns(p)
	}
	in.SetDenials(m.svc.Denials)
	st := m.certs.IssuerStatus()
	if in.CA = admin.NewLink(orDefault(m.opts.CADir, "in memory"), st.OK, st.Since, st.LastError); in.CA.State != admin.LinkDisconnected {
		in.CA.State = admin.LinkBuiltIn
	}
	return in
}

// workloadState is /config_dump's workloadState: every proxied workload by
// uid, Up, with its live connections.
func (m *Mesh) workloadState(snap *state.Snapshot) map[string]admin.WorkloadState {
	out := make(map[string]admin.WorkloadState, len(m.proxies))
	for _, p := range m.proxies {
		out[p.UID()] = admin.WorkloadState{
			State:       inpod.StateUp,
			Info:        admin.InfoOf(snap.WorkloadByUID(p.UID())),
			Connections: admin.ConnectionsOf(p),
		}
	}
	return out
}

// startProxies creates and binds a proxy for every workload with an IP on
// this host: its listeners, SOCKS5 and DNS proxy bound to that IP, its
// outbound sockets from it, standing in for the pod network namespace that
// gives ztunnel's sockets the pod IP.
func (m *Mesh) startProxies(ctx context.Context) error {
	for _, w := range m.store.Snapshot().Workloads() {
		ip, ok := localIP(w)
		if !ok {
			continue
		}
		cfg := m.env.Proxy(m.svc, envconfig.Workload{UID: w.UID, BindAddr: ip, OutboundSource: ip})
		cfg.IgnoreForwarded = m.opts.IgnoreForwarded
		p, err := proxy.New(cfg)
		if err != nil {
			return err
		}
		if err := p.Listen(ctx); err != nil {
			return err
		}
		m.proxies = append(m.proxies, p)
	}
	if len(m.proxies) == 0 {
		return errors.New("local: no workload has an IP on this host; nothing to serve")
	}
	return nil
}

// localIP returns the first of w's addresses that belongs to this host
// (loopback addresses always do on Linux).
func localIP(w *state.Workload) (netip.Addr, bool) {
	for _, a := range w.Addresses {
		if a.IsLoopback() || sockopt.IsLocal(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (m *Mesh) signalQuit() { m.quitOnce.Do(func() { close(m.quit) }) }

// Quit is closed when POST /quitquitquit asks for a shutdown.
func (m *Mesh) Quit() <-chan struct{} { return m.quit }

// AdminAddr, MetricsAddr and ReadinessAddr are the bound side ports.
func (m *Mesh) AdminAddr() net.Addr     { return m.ports.Admin.Addr() }
func (m *Mesh) MetricsAddr() net.Addr   { return m.ports.Metrics.Addr() }
func (m *Mesh) ReadinessAddr() net.Addr { return m.ports.Readiness.Addr() }

// Shutdown drains: listeners stop at once, connections may finish until ctx
// is done, then the rest are closed (SPEC §8.4).
func (m *Mesh) Shutdown(ctx context.Context) error {
	m.ready.Block("shutdown")
	errs := make([]error, len(m.proxies))
	var wg sync.WaitGroup
	for i, p := range m.proxies {
		wg.Go(func() { errs[i] = p.Shutdown(ctx) })
	}
	wg.Wait()
	return errors.Join(append(errs, m.closeAll())...)
}

// closeAll stops everything that is still running, without draining, and
// returns the first failure of a background loop.
func (m *Mesh) closeAll() error {
	for _, p := range m.proxies {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.Shutdown(ctx)
	}
	if m.echo != nil {
		m.echo.Close()
	}
	err := m.run.Stop()
	m.ports.Shutdown(context.Background())
	return err
}

// Done is closed when a background loop failed: the mesh must shut down,
// and Shutdown returns that failure.
func (m *Mesh) Done() <-chan struct{} { return m.run.Failed() }

// banner prints every listener and commands to try.
func (m *Mesh) banner() {
	out := m.opts.Out
	if out == nil {
		return
	}
	fmt.Fprintln(out, "gozt local: mesh running")
	for _, p := range m.proxies {
		for _, name := range []string{"outbound", "plaintext", "inbound", "socks5"} {
			if a, ok := p.Addrs()[name]; ok {
				fmt.Fprintf(out, "  %-28s %-9s %s\n", p.UID(), name, a)
			}
		}
		if d := p.DNS(); d != nil {
			if udp, _ := d.Addrs(); len(udp) > 0 {
				fmt.Fprintf(out, "  %-28s %-9s %s (udp+tcp)\n", p.UID(), "dns", udp[0])
			}
		}
	}
	fmt.Fprintf(out, "  admin      http://%s/config_dump\n", m.AdminAddr())
	fmt.Fprintf(out, "  metrics    http://%s/metrics\n", m.MetricsAddr())
	fmt.Fprintf(out, "  readiness  http://%s/healthz/ready\n", m.ReadinessAddr())
	if m.echo != nil {
		fmt.Fprintf(out, "  demo echo backend on %s\n\nTry:\n", DemoBackendAddr)
		fmt.Fprintln(out, "  curl --socks5 127.0.0.2:15080 http://127.0.0.3:8080/")
		fmt.Fprintln(out, "  curl --socks5 127.0.0.2:15080 http://127.10.0.1:80/")
		fmt.Fprintln(out, "  curl --socks5-hostname 127.0.0.2:15080 http://echo.demo.svc.cluster.local/")
		fmt.Fprintln(out, "  dig @127.0.0.2 -p 15053 echo.demo.svc.cluster.local   # or echo.demo, echo; +tcp for TCP")
	}
}

// dumpConfig is the "config" section of /config_dump.
func (m *Mesh) dumpConfig() map[string]any {
	return map[string]any{
		"proxyMode":     "local",
		"network":       m.env.Network,
		"adminAddr":     m.AdminAddr().String(),
		"statsAddr":     m.MetricsAddr().String(),
		"readinessAddr": m.ReadinessAddr().String(),
		"localXdsPath":  m.opts.ConfigPath,
		"caDir":         m.opts.CADir,
	}
}
