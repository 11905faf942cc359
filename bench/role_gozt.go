package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/internal/runner"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
	"github.com/gozt/gozt/xds"
)

// goztRole runs gozt's data path for some workloads of the bench mesh,
// assembled as `gozt proxy` assembles it: the services envconfig's
// NewServices makes (metrics, admission control, connection manager, DNS
// and host resolvers, denials, a logger) and one proxy.Proxy per workload
// from envconfig's builder, with the configuration gozt proxy has in an
// empty environment (envconfig.Default). What differs is set where the
// proxies are made (startProxies). The store holds the local config,
// optionally fed by xDS as well, and the certificates come from the
// built-in CA. The harness runs the outbound (client) and inbound (server)
// workloads in separate processes, as two nodes would.
//
// With --netns the role runs in shared (in-pod) mode: every listener and
// every upstream socket of its proxies is made inside that network
// namespace through proxy.Config.InNetns, as `gozt proxy` does for the pods
// istio-cni hands it (netns.Handle.Run).
type goztRole struct {
	env     envconfig.Config
	log     *slog.Logger
	svc     envconfig.Services
	store   *state.Store
	certs   *certs.Manager
	proxies []*proxy.Proxy
	netns   *netns.Handle  // the pod network namespace of --netns, or nil
	run     *runner.Runner // certificates, accept loops, xDS
	addrs   map[string]string
	applied time.Duration // how long the initial batch (config and policies) took

	// The bench policies of --policies, which "policies off" removes and
	// "policies on" puts back, so that a scenario can measure the same
	// proxy with and without them.
	policies []*rbac.Policy
}

// command serves "policies on" and "policies off".
func (g *goztRole) command(_ context.Context, name string, args []string) (string, error) {
	if name != "policies" || len(args) != 1 || (args[0] != "on" && args[0] != "off") {
		return "", fmt.Errorf("unknown command %q %q (want: policies on|off)", name, args)
	}
	var err error
	g.store.Update(func(b *state.Batch) {
		for _, p := range g.policies {
			if args[0] == "off" {
				b.RemovePolicy(p.Key())
			} else if err = b.InsertPolicy(p); err != nil {
				return
			}
		}
	})
	return "", err
}

func startGozt(ctx context.Context, args []string) (_ role, err error) {
	fs := flag.NewFlagSet("gozt", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "local config `FILE`")
	caDir := fs.String("ca-dir", "", "CA directory")
	uids := fs.String("uids", "", "comma-separated workload `UIDS` to serve")
	poolMax := fs.Int("pool-max-streams", 0, "streams per pooled HBONE connection (0: gozt's default)")
	policies := fs.Int("policies", 0, "insert `N` authorization policies applying to --policy-ns")
	policyNS := fs.String("policy-ns", rbacNS, "namespace of the --policies")
	xdsAddr := fs.String("xds", "", "xDS server `URL` (https://host:port); empty: none")
	xdsCA := fs.String("xds-ca", "", "PEM `FILE` of the xDS server's certificate")
	nsPath := fs.String("netns", "", "make every socket in the network namespace at `PATH` (shared mode); empty: the process's own")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	g := &goztRole{addrs: map[string]string{}, run: runner.New(), env: envconfig.Default(), log: benchLogger()}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if *nsPath != "" {
		if g.netns, err = netns.Open(*nsPath); err != nil {
			return nil, err
		}
	}
	// No memory limit: gozt proxy's is its cgroup's, which a bench process
	// lacks, and some scenarios run the role with GOGC=off, where memory
	// admission would shed on a heap that only grows. Descriptor
	// exhaustion is still watched.
	g.svc = g.env.NewServices(envconfig.Process{Registry: prometheus.NewRegistry(), Logger: g.log})
	g.policies = benchPolicies(*policyNS, *policies)
	if g.store, g.applied, err = loadStore(*cfgPath, g.policies, g.svc.ConnMgr.Notify); err != nil {
		return nil, err
	}
	ca, err := localca.New(localca.Config{Dir: *caDir})
	if err != nil {
		return nil, err
	}
	g.certs = certs.NewManager(certs.ManagerConfig{Issuer: ca, Logger: g.log.With("scope", "certs")})
	// Every proxy gets the manager itself, as in gozt local; gozt proxy
	// hands each a view limited to its own workload's identity
	// (cmd/gozt's node.ownCerts), one snapshot lookup per certificate
	// asked for, which the bench does not pay.
	g.svc.Store, g.svc.Certs = g.store, g.certs
	if err := g.startProxies(ctx, strings.Split(*uids, ","), *poolMax); err != nil {
		return nil, err
	}
	if *xdsAddr != "" {
		if err := g.startXDS(*xdsAddr, *xdsCA); err != nil {
			return nil, err
		}
	}
	g.run.Go("certs", g.certs.Run)
	g.run.Go("connmgr", g.svc.ConnMgr.Run)
	g.run.Go("admission", g.svc.Admission.Run)
	g.run.Go("metrics series", func(ctx context.Context) error { return g.svc.Metrics.SweepSeries(ctx, g.store) })
	for _, p := range g.proxies {
		g.run.Go("proxy", func(context.Context) error { return p.Serve() })
	}
	return g, nil
}

// benchLogger is the role's logger: warnings and errors to stderr, which
// the harness shows when the role fails. gozt proxy logs at info by
// default, an access line per connection among them; the bench measures
// the data path without them, as an operator who turns them down runs it.
func benchLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// loadStore returns a store holding the local config at path and the
// policies, applied in one batch, and how long the batch took; notify
// learns of every update, as the connection manager does in gozt proxy.
func loadStore(path string, policies []*rbac.Policy, notify func(*state.Snapshot)) (*state.Store, time.Duration, error) {
	static, err := xds.LoadLocalConfig(path)
	if err != nil {
		return nil, 0, err
	}
	st := state.NewStore(state.Config{OnUpdate: func(_, next *state.Snapshot) { notify(next) }})
	start := time.Now()
	st.Update(func(b *state.Batch) {
		if err = static.Apply(b); err != nil {
			return
		}
		for _, p := range policies {
			if err = b.InsertPolicy(p); err != nil {
				return
			}
		}
	})
	return st, time.Since(start), err
}

// startProxies binds a proxy for each workload of uids, on the workload's
// IP as `gozt local` binds them (with --netns, that IP inside the pod's
// namespace), where the harness reaches it through SOCKS5.
func (g *goztRole) startProxies(ctx context.Context, uids []string, poolMax int) error {
	snap := g.store.Snapshot()
	for _, uid := range uids {
		if uid == "" {
			continue
		}
		w := snap.WorkloadByUID(uid)
		if w == nil || len(w.Addresses) == 0 {
			return fmt.Errorf("workload %q not in the config", uid)
		}
		ip := w.Addresses[0]
		work := envconfig.Workload{UID: uid, BindAddr: ip, OutboundSource: ip}
		if g.netns != nil {
			work.InNetns = g.netns.Enter
		}
		cfg := g.env.Proxy(g.svc, work)
		cfg.EnableSOCKS5 = true // the harness's way in (UNSTABLE_ENABLE_SOCKS5)
		if g.netns == nil {
			// Dedicated mode's PACKET_MARK default is none; only shared
			// mode marks (1337), and SO_MARK needs CAP_NET_ADMIN, which the
			// scenarios without --netns do not require.
			cfg.Mark = 0
		}
		if poolMax > 0 {
			cfg.PoolMaxStreams = poolMax
		}
		p, err := proxy.New(cfg)
		if err != nil {
			return err
		}
		if err := p.Listen(ctx); err != nil {
			return err
		}
		g.proxies = append(g.proxies, p)
		g.addrs[uid] = ip.String()
	}
	return nil
}

// startXDS runs an xDS client that feeds the same store, as in a cluster.
func (g *goztRole) startXDS(addr, caFile string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return errors.New("xds-ca: no certificate")
	}
	tlsCfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c, err := xds.NewClient(xds.Config{ // as gozt proxy
		Address: addr, TLS: tlsCfg, Store: g.store, TunePushes: true, Logger: g.log.With("scope", "xds"),
	})
	if err != nil {
		return err
	}
	g.run.Go("xds", c.Run)
	return nil
}

func (g *goztRole) info() map[string]string { return g.addrs }

func (g *goztRole) stats(m map[string]any) {
	m["workloads"], m["services"], m["policies"] = g.store.Snapshot().Counts()
	m["initial_apply_seconds"] = g.applied.Seconds()
}

// close force-closes every proxy (no drain) and waits for everything.
func (g *goztRole) close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for _, p := range g.proxies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = p.Shutdown(ctx)
		}()
	}
	wg.Wait()
	err := g.run.Stop()
	if g.netns != nil {
		err = errors.Join(err, g.netns.Close())
	}
	return err
}

// failed is closed once one of the role's loops has failed; close then
// returns that failure.
func (g *goztRole) failed() <-chan struct{} { return g.run.Failed() }
