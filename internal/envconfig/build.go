package envconfig

import (
	"log/slog"
	"net"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockwait"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// The one builder of a proxy's configuration (issue 38): `gozt proxy`
// (shared and dedicated mode), `gozt local` and the bench's gozt role each
// make their process's Services and call Config.Proxy for every workload
// they serve, so that the three assemble the same proxy. Where a mode
// differs, the caller sets the field on the result, in plain sight.

// Services are the components a process makes once and hands to every proxy
// it runs.
type Services struct {
	// Store is the mesh state. Required.
	Store *state.Store
	// Certs issues the workload certificates. Required. `gozt proxy`
	// hands each proxy a view of its manager limited to the proxy's own
	// workload's identity.
	Certs proxy.CertSource
	// Metrics records traffic metrics. Required.
	Metrics *telemetry.Metrics
	// Admission sheds new connections under memory pressure and learns of
	// descriptor exhaustion; nil admits every connection.
	Admission *admission.Controller
	// ConnMgr re-checks live connections when policies change; or nil.
	ConnMgr *connmgr.Manager
	// DNS answers every workload's DNS proxy; nil (DNS_CAPTURE off) runs
	// none.
	DNS *dns.Resolver
	// Hosts resolves endpoints that have a hostname and no IPs (SPEC
	// §3.3); nil fails connections to them.
	Hosts *dns.HostResolver
	// Denials records the connections authorization refuses; or nil.
	Denials *telemetry.Denials
	// Demand fetches an address the store lacks from the control plane
	// (the xDS client), or nil. Proxies use it only with XDS_ON_DEMAND.
	Demand state.Demander
	// Sockets parks the proxies' idle listeners, so that an idle pod's
	// listeners hold no goroutine (proxy.Config.Sockets); nil does not.
	// NewServices makes one in shared mode only, whose process serves
	// every pod of the node; a process of one proxy would gain a few KB
	// for a wake per connection after each idle second.
	Sockets *sockwait.Set
	// Logger receives the proxies' logs (scope "proxy") and access lines
	// (scope "access"); nil discards them.
	Logger *slog.Logger
}

// Process is what NewServices needs of the process besides the
// environment.
type Process struct {
	// Registry receives the traffic and DNS metrics. Required.
	Registry prometheus.Registerer
	// ResolvConf is the resolv.conf of the DNS proxy's upstream servers
	// and of hostname endpoints; if empty /etc/resolv.conf, as ztunnel
	// reads its own.
	ResolvConf string
	// MemoryLimit is the memory limit in force, in bytes, against which
	// admission control refuses new connections (admission.Config);
	// zero turns memory shedding off.
	MemoryLimit int64
	// Logger receives the services' logs; nil discards them.
	Logger *slog.Logger
}

// NewServices returns the services the environment configures: the
// traffic metrics, the DNS proxy's resolver (nil with DNS_CAPTURE off, its
// metrics registered all the same), the host resolver, admission control,
// the connection manager, the denials record and, in shared mode, the set
// where idle listeners park. Store, Certs and Demand
// are the caller's to set; so is running the connection manager, admission
// control and the metrics sweep.
func (c Config) NewServices(p Process) Services {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	resolvConf := orDefault(p.ResolvConf, "/etc/resolv.conf")
	var sockets *sockwait.Set
	if c.ProxyMode == ModeShared {
		sockets = sockwait.New()
	}
	return Services{
		Metrics: telemetry.NewMetricsWithConfig(p.Registry, telemetry.MetricsConfig{
			SeriesGrace: c.MetricsSeriesGrace, MaxSeries: c.MetricsMaxSeries,
		}),
		DNS:       c.newDNSResolver(resolvConf, dns.NewMetrics(p.Registry), log),
		Hosts:     c.newHostResolver(resolvConf, log),
		Admission: admission.New(admission.Config{MemoryLimit: p.MemoryLimit, Logger: log.With("scope", "admission")}),
		ConnMgr:   connmgr.New(connmgr.Config{Logger: log.With("scope", "connmgr")}),
		Denials:   telemetry.NewDenials(0),
		Sockets:   sockets,
		Logger:    log,
	}
}

// newDNSResolver returns the DNS proxy's resolver, or nil when DNS_CAPTURE
// turns it off. Shared mode strips each pod's Kubernetes search domains,
// dedicated mode resolv.conf's search list (SPEC §10.1). Without a readable
// resolv.conf mesh names still resolve and other names answer SERVFAIL.
func (c Config) newDNSResolver(resolvConf string, m *dns.Metrics, log *slog.Logger) *dns.Resolver {
	if !c.DNSCapture {
		return nil
	}
	rc, err := dns.ReadResolvConf(resolvConf)
	if err != nil {
		log.Warn("dns proxy: no upstream servers; only mesh names will resolve", "error", err)
	}
	cfg := dns.Config{
		ClusterDomain: c.ClusterDomain, PreferredNamespace: c.PreferredServiceNamespace,
		DisableIPv6: !c.IPv6Enabled, Upstreams: rc.Servers, UpstreamTimeout: rc.Timeout,
		UpstreamAttempts: rc.Attempts, Metrics: m, Logger: log.With("scope", "dns"),
	}
	if c.ProxyMode == ModeDedicated {
		search := rc.Search
		cfg.SearchDomains = func(*state.Workload) []string { return search }
	}
	return dns.NewResolver(cfg)
}

// newHostResolver returns the resolver of endpoints that have a hostname
// and no IPs (SPEC §3.3), from the process's resolv.conf whatever
// DNS_CAPTURE says, as ztunnel's on-demand resolver reads its own; A
// records only when IPV6_ENABLED is false. Without a readable resolv.conf
// every such lookup fails (ztunnel does not start then).
func (c Config) newHostResolver(resolvConf string, log *slog.Logger) *dns.HostResolver {
	cfg, err := dns.ReadHostConfig(resolvConf)
	if err != nil {
		log.Warn("on-demand dns: no upstream servers; hostname endpoints will not resolve", "error", err)
	}
	cfg.IPv4Only = !c.IPv6Enabled
	return dns.NewHostResolver(cfg)
}

// Workload is what one proxy serves, and where.
type Workload struct {
	// UID is the workload's uid; Local, if set, finds the workload in a
	// snapshot instead (proxy.Config). One of them is required.
	UID   string
	Local func(*state.Snapshot) *state.Workload
	// BindAddr is the IP the listeners bind to; if invalid, the
	// unspecified address ([::], or 0.0.0.0 with IPV6_ENABLED false). A
	// specific IP also carries the SOCKS5 listener and the DNS proxy (on
	// DNS_PROXY_ADDR's port), which otherwise bind loopback, as ztunnel's
	// do inside a pod.
	BindAddr netip.Addr
	// OutboundSource, if valid, is bound as the source of outbound
	// connections.
	OutboundSource netip.Addr
	// InNetns, if non-nil, makes every socket inside the pod's network
	// namespace (shared mode); the listeners then take SO_REUSEPORT as
	// INPOD_PORT_REUSE says.
	InNetns netns.Func
}

// Proxy returns the configuration of the proxy serving w with the services
// s, every setting from c. The caller sets what its mode does differently
// on the result.
func (c Config) Proxy(s Services, w Workload) proxy.Config {
	cfg := proxy.Config{
		WorkloadUID: w.UID, Local: w.Local, OutboundSource: w.OutboundSource, InNetns: w.InNetns,
		ReusePort: w.InNetns != nil && c.InpodPortReuse,
		Network:   c.Network,
		Store:     s.Store, Certs: s.Certs, Metrics: s.Metrics, Admission: s.Admission, ConnMgr: s.ConnMgr,
		DNS: s.DNS, Hosts: s.Hosts, Denials: s.Denials, Sockets: s.Sockets,
		// workloadState and the live view list every mode's connections.
		ListConnections: true,
		EnableSOCKS5:    c.EnableSOCKS5,
		HBONE:           hbone.Config{StreamWindow: c.StreamWindow, ConnWindow: c.ConnWindow, MaxFrameSize: c.FrameSize},
		PoolMaxStreams:  c.PoolMaxStreams, PoolIdleTimeout: c.PoolIdleTimeout,
		Spoof:           c.spoof(),
		IgnoreForwarded: !c.TrustWaypointForwarded,
		NoEarlyData:     !c.EarlyData,
		// LOCALHOST_APP_TUNNEL (SPEC §2.7).
		AppTunnelToPodIP: !c.LocalhostAppTunnel,
		Mark:             c.PacketMark,
		KeepAlive: &net.KeepAliveConfig{
			Enable: c.KeepaliveEnabled, Idle: c.KeepaliveTime, Interval: c.KeepaliveInterval, Count: c.KeepaliveRetries,
		},
		UserTimeout:       c.UserTimeout(),
		NoResponseBaggage: !c.ResponseBaggage,
		TLS:               c.TLSPolicy(),
		AuthzInfoLogging:  c.AuthzPolicyInfoLogging,
		DNSOnly:           !c.EnableProxy,
	}
	if c.XDSOnDemand {
		cfg.Demand = s.Demand // XDS_ON_DEMAND (SPEC §5.3)
	}
	if s.Logger != nil {
		cfg.Logger, cfg.AccessLog = s.Logger.With("scope", "proxy"), s.Logger.With("scope", "access")
	}
	cfg.BindAddr, cfg.SOCKS5Addr, cfg.DNSAddrs = c.listenAddrs(w.BindAddr)
	return cfg
}

// listenAddrs returns where a proxy given bind listens: its workload
// listeners, its SOCKS5 listener and its DNS proxy. ztunnel binds SOCKS5
// to 127.0.0.1 (inside the pod in shared mode), never to the network, and
// the DNS proxy to DNS_PROXY_ADDR; a proxy bound to a specific IP (gozt
// local and the bench run several side by side on loopback IPs) keeps both
// on its own IP.
func (c Config) listenAddrs(bind netip.Addr) (netip.Addr, netip.Addr, []netip.AddrPort) {
	dnsAddrs := c.DNSListenAddrs()
	if !bind.IsValid() {
		bind = netip.IPv6Unspecified()
		if !c.IPv6Enabled {
			bind = netip.IPv4Unspecified()
		}
	}
	if bind.IsUnspecified() {
		return bind, netip.AddrFrom4([4]byte{127, 0, 0, 1}), dnsAddrs
	}
	if len(dnsAddrs) > 0 {
		dnsAddrs = []netip.AddrPort{netip.AddrPortFrom(bind, dnsAddrs[0].Port())}
	}
	return bind, bind, dnsAddrs
}

// spoof is ENABLE_ORIG_SRC: unset lets the proxy decide, true requires
// the client's source IP, false never binds it.
func (c Config) spoof() proxy.SpoofMode {
	switch {
	case c.EnableOrigSrc == nil:
		return proxy.SpoofAuto
	case *c.EnableOrigSrc:
		return proxy.SpoofRequired
	default:
		return proxy.SpoofOff
	}
}

// TLSPolicy is the TLS policy of TLS12_ENABLED and COMPLIANCE_POLICY, for
// HBONE and the control plane alike.
func (c Config) TLSPolicy() certs.Policy {
	return certs.Policy{TLS12: c.TLS12Enabled, PQC: c.CompliancePolicy == CompliancePQC}
}

// Default returns the configuration `gozt proxy` runs with when the
// environment sets nothing and there is no mesh config file (shared mode):
// the bench's gozt role runs with it.
func Default() Config {
	c, err := load(nil, "")
	if err != nil {
		panic("envconfig: the empty environment is invalid: " + err.Error())
	}
	return c
}
