// Package proxy runs one workload's data plane: the outbound (15001),
// inbound plaintext (15006), inbound HBONE (15008) and SOCKS5 (15080)
// listeners of SPEC §1–3, routing through state, tunnels through hbone
// and byte copying through proxy/relay.
//
// One Proxy serves one workload, as ztunnel runs one set of listeners per pod.
// cmd/gozt creates a Proxy per local workload and wires its dependencies.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/proxy/sockwait"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// The fixed ports of a workload's listeners (SPEC §1.1).
const (
	OutboundPort  = 15001
	PlaintextPort = 15006
	InboundPort   = HBONEPort
	SOCKS5Port    = 15080
)

// CertSource gives the certificate of a workload identity; *certs.Manager
// implements it.
type CertSource interface {
	Get(ctx context.Context, id identity.Identity) (*certs.Cert, error)
}

var _ CertSource = (*certs.Manager)(nil)

// Config configures a Proxy. Zero values mean the documented defaults.
type Config struct {
	// WorkloadUID is the uid of the workload this proxy serves. Required
	// unless Local is set.
	WorkloadUID string
	// Local, if non-nil, finds the workload this proxy serves in a snapshot
	// (dedicated mode knows its workload by namespace/name/service account
	// before xDS delivers its uid).
	Local func(*state.Snapshot) *state.Workload
	// BindAddr is the IP the listeners bind to: the workload's IP in local
	// mode, the unspecified address inside a pod's network namespace.
	BindAddr netip.Addr
	// OutboundSource, if valid, is bound as the source of outbound
	// connections (HBONE and plain TCP). In local mode it is the workload's
	// IP, standing in for the pod network namespace that gives ztunnel's
	// sockets the pod IP.
	OutboundSource netip.Addr
	// SOCKS5Addr, if valid, is the IP the SOCKS5 listener binds to instead
	// of BindAddr: 127.0.0.1 in `gozt proxy`, as ztunnel binds it, so the
	// unauthenticated proxy never faces the network.
	SOCKS5Addr netip.Addr
	// InNetns, if non-nil, runs functions inside the network namespace
	// this proxy serves (a pod's, in shared mode, SPEC §1.3): every
	// listener and every upstream socket is created inside it. Nil means
	// the current one.
	InNetns netns.Func
	// InboundOnly binds only the inbound HBONE listener (15008): shared
	// mode's self-proxy, which serves gozt's own identity (SPEC §1.3).
	InboundOnly bool
	// DNSOnly binds only the DNS proxy, no TCP listener (ENABLE_PROXY=false).
	DNSOnly bool
	// ListConnections keeps the list of open connections that Connections
	// returns (shared mode's /config_dump workloadState) and, with the
	// bytes each moved so far, LiveConnections (the admin live view).
	ListConnections bool
	// Denials, if non-nil, records every connection authorization refuses,
	// with the deciding policy and rule (the admin live view); proxies may
	// share one.
	Denials *telemetry.Denials
	// ReusePort sets SO_REUSEPORT on the listeners, so an old and a new
	// gozt share a pod's ports during an upgrade (INPOD_PORT_REUSE).
	ReusePort bool
	// Network is this node's network name (NETWORK).
	Network string
	// Store is the mesh state. Required.
	Store *state.Store
	// Demand, if non-nil, fetches an address the store does not hold from
	// the control plane before a connection is decided (XDS_ON_DEMAND,
	// SPEC §5.3; ondemand.go). Nil: a miss is final.
	Demand state.Demander
	// DemandLimits bounds this proxy's on-demand fetches; zero fields take
	// the defaults (ondemand.go).
	DemandLimits DemandLimits
	// Certs issues the workload certificates. Required.
	Certs CertSource
	// Metrics records traffic metrics. Required.
	Metrics *telemetry.Metrics
	// ConnMgr, if non-nil, re-checks live inbound connections when policies
	// change and closes those now denied (SPEC §4.4).
	ConnMgr *connmgr.Manager
	// Admission, if non-nil, refuses new connections under memory pressure
	// and learns of file-descriptor exhaustion, for readiness (package
	// admission); every proxy of the process shares one. Nil admits every
	// connection.
	Admission *admission.Controller
	// Sockets, if non-nil, parks each listener and DNS socket nothing has
	// come to for acceptIdle, so that an idle one holds no goroutine: its
	// loop returns and the Set starts it again when something comes
	// (package sockwait; issue 40); idle relay directions park there too.
	// Every proxy of the process shares one. Nil: each listener's loop
	// waits on its goroutine, and the relay parks in a set of the proxy's
	// own.
	Sockets *sockwait.Set
	// EnableSOCKS5 opens the SOCKS5 listener (15080).
	EnableSOCKS5 bool
	// DNS, if non-nil, runs the workload's DNS proxy on DNSAddrs (UDP and
	// TCP each, made like the other listeners) answering through DNS, which
	// also resolves SOCKS5 domain targets (SPEC §10). Nil means no DNS
	// proxy, and SOCKS5 refuses domain targets.
	DNS      *dns.Resolver
	DNSAddrs []netip.AddrPort
	// Hosts resolves, at connect time, the hostname of an endpoint that has
	// no IPs (SPEC §3.3). If nil, connections to such endpoints fail.
	Hosts HostResolver
	// HBONE holds the HTTP/2 settings; zero fields take ztunnel's defaults.
	HBONE hbone.Config
	// PoolMaxStreams caps streams per pooled HBONE connection; if zero 100.
	PoolMaxStreams int
	// PoolIdleTimeout releases unused pooled connections; if zero 5m.
	PoolIdleTimeout time.Duration
	// Spoof controls source IP preservation on inbound dials (ENABLE_ORIG_SRC).
	Spoof SpoofMode
	// NoEarlyData makes outbound HBONE wait for the CONNECT's 200 before the
	// client's first bytes leave, as ztunnel does (HBONE_EARLY_DATA=false);
	// by default they go with the CONNECT (see dialOutbound).
	NoEarlyData bool
	// IgnoreForwarded ignores the Forwarded header of inbound HBONE
	// requests, as ztunnel does (TRUST_WAYPOINT_FORWARDED=false). If false,
	// the for= IP a request from the destination's own waypoint carries is
	// the upstream source instead of the waypoint's (SPEC §2.5); from any
	// other peer the header is always ignored.
	IgnoreForwarded bool
	// AppTunnelToPodIP delivers PROXY-protocol application tunnels to the
	// pod IP, with the source chosen as for any inbound connection
	// (LOCALHOST_APP_TUNNEL=false). If false, ztunnel's default, they go
	// over loopback from a loopback source (SPEC §2.7).
	AppTunnelToPodIP bool
	// Mark, if non-zero, is set as SO_MARK on every socket.
	Mark uint32
	// KeepAlive is the TCP keep-alive of upstream sockets and of sockets
	// accepted on 15001 and 15006 (SPEC §0.3 KEEPALIVE_*); nil means
	// ztunnel's defaults (DefaultKeepAlive()), Enable false turns it off.
	// Sockets on 15008 rely on HTTP/2 PINGs instead.
	KeepAlive *net.KeepAliveConfig
	// UserTimeout, if positive, is the TCP_USER_TIMEOUT of the same sockets
	// as KeepAlive (USER_TIMEOUT_ENABLED); zero leaves the kernel's.
	UserTimeout time.Duration
	// NoResponseBaggage leaves the baggage header off inbound HBONE
	// responses and leaves an inbound request's baggage unread
	// (ENABLE_RESPONSE_BAGGAGE=false, ztunnel's enable_enhanced_baggage); by
	// default the 200 describes the local workload, and a request's baggage
	// gives the source labels of a source that cannot be looked up (SPEC §2.3).
	NoResponseBaggage bool
	// TLS is the HBONE TLS policy (TLS12_ENABLED, COMPLIANCE_POLICY); the
	// zero value is TLS 1.3 only, as ztunnel's default.
	TLS certs.Policy
	// AuthzInfoLogging logs each authorization decision at info instead of
	// debug (AUTHZ_POLICY_INFO_LOGGING).
	AuthzInfoLogging bool
	// Logger receives operational logs; AccessLog the per-connection lines.
	// If nil, logs are discarded.
	Logger    *slog.Logger
	AccessLog *slog.Logger
}

// SpoofMode is ENABLE_ORIG_SRC (SPEC §0.3, §2.5).
type SpoofMode uint8

const (
	// SpoofAuto preserves the source IP when the listener could be made
	// transparent, or when the source IP is local anyway.
	SpoofAuto SpoofMode = iota
	// SpoofRequired fails the connection when the source cannot be preserved.
	SpoofRequired
	// SpoofOff never binds the source IP.
	SpoofOff
)

// DefaultKeepAlive returns ztunnel's TCP keep-alive: probes after 180 s
// idle, every 180 s, 9 of them (SPEC §0.3).
func DefaultKeepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}
}

const (
	handshakeTimeout = 10 * time.Second // TLS handshake deadline on 15008 (TESTPLAN 21)
	connectTimeout   = 10 * time.Second // every upstream connect (SPEC §2.1)
)

// Proxy is one workload's set of listeners.
type Proxy struct {
	cfg       Config
	log       *slog.Logger
	accessLog *slog.Logger
	pool      *hbone.Pool
	hbone     *hbone.Server
	// relays parks the idle connections' TCP legs, so that an idle
	// connection holds no goroutine (issue 16); every close of a relayed
	// leg while its copy may run goes through it (abortLeg, forceClose).
	relays  *relay.Poller
	dns     *dns.Server  // or nil
	illegal illegalPorts // ports a connection may never target (SPEC §1.2)
	demands *demandGate  // bounds the on-demand fetches (ondemand.go)
	// transparent reports whether IP_TRANSPARENT took effect on the inbound
	// listener; set by Listen, read-only afterwards.
	transparent bool

	// lifetime ends every connection when cancelled (force close).
	lifetime context.Context
	cancel   context.CancelFunc

	mu        sync.Mutex
	listeners map[string]net.Listener // by name: outbound, plaintext, inbound, socks5
	acceptors []*acceptor             // their accept loops, made by Start
	// conns holds the accepted connections, for drain and force close, each
	// with the istio_tcp_sockets_open gauge of its reporter.
	conns map[net.Conn]prometheus.Gauge
	// closing is set by forceClose: connections accepted after it are
	// closed at once (during the graceful drain they are still served).
	closing bool

	wg sync.WaitGroup // accept loops and connection handlers

	accept acceptGuard // the spare descriptor and accept-failure logging (accept.go)

	live telemetry.ConnList // open connections, when cfg.ListConnections

	// peers holds the client identity of each inbound HBONE connection
	// (*tls.Conn → *peer).
	peers sync.Map
	// tunnels holds every open mTLS connection, either way, for CRL
	// re-checks (crl.go): *tls.Conn or *hbone.ClientConn → *tunnel.
	tunnels sync.Map
}

// New validates cfg and returns a Proxy that has not bound anything yet.
func New(cfg Config) (*Proxy, error) {
	switch {
	case cfg.WorkloadUID == "" && cfg.Local == nil:
		return nil, errors.New("proxy: workload uid is required")
	case cfg.Store == nil || cfg.Certs == nil || cfg.Metrics == nil:
		panic("proxy: New needs Store, Certs and Metrics")
	}
	discard := slog.New(slog.DiscardHandler)
	p := &Proxy{
		cfg:       cfg,
		log:       orDiscard(cfg.Logger, discard).With("workload", cfg.WorkloadUID),
		accessLog: orDiscard(cfg.AccessLog, discard),
		listeners: make(map[string]net.Listener),
		conns:     make(map[net.Conn]prometheus.Gauge),
		illegal:   illegalPorts{OutboundPort, PlaintextPort, InboundPort},
		relays:    relay.NewPoller(cfg.Sockets),
	}
	if cfg.EnableSOCKS5 {
		p.illegal[3] = SOCKS5Port
	}
	if cfg.DNS != nil && len(cfg.DNSAddrs) > 0 {
		// gozt local binds DNS on the workload IP, which an HBONE peer
		// could otherwise make the inbound side dial (loop protection).
		p.illegal[4] = cfg.DNSAddrs[0].Port()
	}
	p.lifetime, p.cancel = context.WithCancel(context.Background())
	p.demands = newDemandGate(cfg.DemandLimits)
	p.pool = hbone.NewPool(hbone.PoolConfig{
		Dial:              p.dialHBONE,
		MaxStreamsPerConn: p.poolMaxStreams(),
		IdleTimeout:       cfg.PoolIdleTimeout,
		Logger:            p.log,
	})
	hcfg := cfg.HBONE
	hcfg.Logger = p.log
	p.hbone = &hbone.Server{Config: hcfg, Handler: p.serveConnect}
	if cfg.DNS != nil && !cfg.InboundOnly {
		p.dns = dns.NewServer(dns.ServerConfig{
			Resolver: cfg.DNS, Local: p.awaitLocalWorkload, Addrs: cfg.DNSAddrs,
			InNetns: cfg.InNetns, Mark: cfg.Mark, ReusePort: cfg.ReusePort, OptionalIPv6: true, Logger: p.log,
			AdmitTCP: p.admitDNS, Sockets: cfg.Sockets, Idle: acceptIdle,
		})
	}
	return p, nil
}

// poolMaxStreams is POOL_MAX_STREAMS_PER_CONNECTION, 100 if unset.
func (p *Proxy) poolMaxStreams() int {
	if p.cfg.PoolMaxStreams > 0 {
		return p.cfg.PoolMaxStreams
	}
	return 100
}

func orDiscard(l, discard *slog.Logger) *slog.Logger {
	if l == nil {
		return discard
	}
	return l
}

// Listen binds every listener. On any failure it closes what it bound and
// returns an error naming the address, so nothing is left half-started.
func (p *Proxy) Listen(ctx context.Context) (err error) {
	type spec struct {
		name string
		port uint16
		opts sockopt.Options
	}
	reuse := p.cfg.ReusePort
	specs := []spec{
		{"outbound", OutboundPort, sockopt.Options{Transparent: true, ReusePort: reuse, Mark: p.cfg.Mark, KeepAlive: p.keepAlive(), UserTimeout: p.cfg.UserTimeout}},
		{"plaintext", PlaintextPort, sockopt.Options{Transparent: true, ReusePort: reuse, Mark: p.cfg.Mark, KeepAlive: p.keepAlive(), UserTimeout: p.cfg.UserTimeout}},
		{"inbound", InboundPort, sockopt.Options{Transparent: true, ReusePort: reuse, Mark: p.cfg.Mark}},
	}
	if p.cfg.EnableSOCKS5 {
		specs = append(specs, spec{"socks5", SOCKS5Port, sockopt.Options{ReusePort: reuse, Mark: p.cfg.Mark}})
	}
	switch {
	case p.cfg.InboundOnly:
		specs = slices.DeleteFunc(specs, func(s spec) bool { return s.name != "inbound" })
	case p.cfg.DNSOnly:
		specs = nil
	}
	defer func() {
		if err != nil {
			p.closeListeners()
			p.accept.closeSpare()
		}
	}()
	p.accept.reacquire()
	// Every socket of the proxy is made in one entry into its namespace
	// (one pair of setns(2) calls per pod, not one per listener): a pod's
	// ZDS Add waits for this (bench/NOTES.md, the node scenario).
	return p.inNetns(func() error {
		for _, s := range specs {
			bind := p.cfg.BindAddr
			if s.name == "socks5" && p.cfg.SOCKS5Addr.IsValid() {
				bind = p.cfg.SOCKS5Addr
			}
			addr := net.JoinHostPort(bind.String(), strconv.Itoa(int(s.port)))
			lc := sockopt.ListenConfig(s.opts)
			l, err := lc.Listen(ctx, "tcp", addr)
			if err != nil {
				return fmt.Errorf("proxy: listen %s on %s: %w", s.name, addr, err)
			}
			p.mu.Lock()
			p.listeners[s.name] = l
			p.mu.Unlock()
			if s.name == "inbound" {
				p.transparent = sockopt.TransparentEnabled(l)
			}
		}
		if p.dns != nil {
			return p.dns.ListenHere(ctx)
		}
		return nil
	})
}

// keepAlive is the keep-alive of upstream and captured sockets.
func (p *Proxy) keepAlive() net.KeepAliveConfig {
	if p.cfg.KeepAlive == nil {
		return DefaultKeepAlive()
	}
	return *p.cfg.KeepAlive
}

// inNetns runs fn inside the proxy's network namespace, or here when it
// has none of its own.
func (p *Proxy) inNetns(fn func() error) error {
	if p.cfg.InNetns == nil {
		return fn()
	}
	return p.cfg.InNetns.Run(fn)
}

// dial connects an upstream socket to addr from src (if valid), inside the
// proxy's network namespace, with the mark and keep-alive of every upstream
// socket. In a pod's namespace only the socket is made there (bound, its
// connect started); a connect that has to wait is waited for outside it,
// so no thread stays locked in the pod's namespace for the round trip
// (gozt bench's shared scenario: 0.85× dedicated connect rate when the
// whole dial ran in the namespace, 0.91× this way). Once made the socket
// belongs to that namespace whatever goroutine uses it.
func (p *Proxy) dial(ctx context.Context, src netip.Addr, addr netip.AddrPort) (net.Conn, error) {
	d := sockopt.Dialer(src, sockopt.Options{Mark: p.cfg.Mark, KeepAlive: p.keepAlive(), UserTimeout: p.cfg.UserTimeout})
	d.Timeout = connectTimeout // the connect's bound, set up only when it has to wait
	var c *net.TCPConn
	var err error
	if p.cfg.InNetns == nil {
		c, err = sockopt.Dial(ctx, d, addr)
	} else {
		c, err = sockopt.DialInNetns(ctx, p.cfg.InNetns, d, addr)
	}
	if err != nil {
		return nil, err // not a typed-nil *net.TCPConn
	}
	return c, nil
}

// Addrs returns the bound listener addresses by name.
func (p *Proxy) Addrs() map[string]net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]net.Addr, len(p.listeners))
	for name, l := range p.listeners {
		m[name] = l.Addr()
	}
	return m
}

// Serve runs the accept loops until Shutdown. It returns after every
// connection it started has finished.
func (p *Proxy) Serve() error {
	p.Start()
	p.wg.Wait()
	if p.dns != nil {
		if err := p.dns.Wait(); err != nil {
			p.log.Warn("dns proxy failed", "error", err)
		}
	}
	return nil
}

// Start runs the accept loops until Shutdown, as Serve does, without a
// goroutine of its own waiting for them: a node of 110 pods in shared
// mode, whose Shutdown waits for each, needs none per pod. Call it once,
// after Listen, and only if Serve is not called.
func (p *Proxy) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	handlers := map[string]handler{
		"outbound":  p.handleOutbound,
		"plaintext": p.handlePlaintext,
		"inbound":   p.handleInbound,
		"socks5":    p.handleSOCKS5,
	}
	for name, l := range p.listeners {
		a := &acceptor{p: p, name: name, handle: handlers[name], open: p.cfg.Metrics.SocketsOpen(name), admitted: p.admitting(l, name)}
		a.wake = a.loop
		if p.cfg.Sockets != nil {
			if rc, err := l.(syscall.Conn).SyscallConn(); err == nil {
				a.watch = p.cfg.Sockets.Watch(rc)
				a.admitted.Idle = acceptIdle
			}
		}
		p.acceptors = append(p.acceptors, a)
		p.wg.Add(1) // the loop's, parked or not, until it ends
		if !a.watch.Park(a.wake) {
			go a.loop()
		}
	}
	if p.dns != nil {
		p.dns.Start()
	}
}

// acceptIdle is how long an accept loop waits for a connection before it
// parks its listener in Config.Sockets. A listener starts parked.
var acceptIdle = time.Second

// acceptor is one listener's accept loop. It runs on a goroutine while
// connections come and is parked in Config.Sockets (watch) while none
// does; either way it holds one unit of the proxy's wait group until its
// listener is closed.
type acceptor struct {
	p        *Proxy
	name     string
	handle   handler
	open     prometheus.Gauge // counts the connections open
	admitted *admission.Listener
	watch    *sockwait.Watch // nil without Config.Sockets
	wake     func()          // loop, made once
}

// loop accepts connections until the listener is closed, or parks it once
// it is idle (admission.ErrIdle) and returns, still holding its unit of
// the wait group, which the next wake's loop, or closeListeners, releases.
func (a *acceptor) loop() {
	p := a.p
	for {
		c, err := a.admitted.Accept()
		if errors.Is(err, admission.ErrIdle) {
			if a.watch.Park(a.wake) {
				return
			}
			continue // the Set or the listener is closed: wait here
		}
		if err != nil {
			p.wg.Done()
			return // closed: admission.Listener handles every other failure
		}
		if !p.track(c, a.open) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		workers.Default.Go(func() { p.runHandler(c, a.name, a.handle) })
	}
}

// handler serves one accepted connection c. It returns the upstream leg it
// opened and the finish that records the connection, for runHandler to hand
// both legs off; or a nil up, and runHandler closes c.
type handler func(c net.Conn) (up net.Conn, finish func(relay.Result, error))

// runHandler runs one connection's handler, then hands the legs it returned
// off to the relay or ends c. A panic closes that connection and nothing
// else (TESTPLAN F26).
func (p *Proxy) runHandler(c net.Conn, listener string, handle handler) {
	defer p.wg.Done()
	up, finish := p.callHandler(c, listener, handle)
	if up == nil {
		p.untrack(c)
		return
	}
	p.handOff(c, listener, up, finish)
}

// testHookHandler, if non-nil, is called before each accepted connection's
// handler with its listener's name: a fault-injection point that tests set
// (export_test.go) to make one connection's handler panic (TESTPLAN F26).
var testHookHandler func(listener string, c net.Conn)

// callHandler calls handle(c); a panic returns no upstream.
func (p *Proxy) callHandler(c net.Conn, listener string, handle handler) (up net.Conn, finish func(relay.Result, error)) {
	defer p.containPanic(c, listener)
	if testHookHandler != nil {
		testHookHandler(listener, c)
	}
	return handle(c)
}

// containPanic, deferred, logs and stops a panic in the handling of the
// connection from c, accepted on listener, and counts it in
// gozt_connection_handler_panics_total.
func (p *Proxy) containPanic(c net.Conn, listener string) {
	if r := recover(); r != nil {
		p.cfg.Metrics.Panics(listener).Inc()
		p.log.Error("connection handler panicked", "listener", listener, "panic", r,
			"src.addr", c.RemoteAddr(), "stack", string(debug.Stack()))
	}
}

// handOff is the one way a connection reaches the relay: it copies down to up
// and back on relay.Poller.Start's goroutines and returns at once, so the
// handler's goroutine, whose stack routing, dialing and TLS grew, goes back
// to its pool (internal/workers) instead of idling for the connection's
// lifetime (DESIGN "Making HBONE fast": an idle connection holds only a
// minimal goroutine).
//
// From the call on the relay owns both legs and down's tracking: the caller
// never touches them again, and once both directions have ended the relay
// closes up and down, runs finish, then untracks down.
//
// The caller must hold a unit of p.wg, as every handler does and every
// CONNECT stream through its TLS connection's handler, so that Shutdown is
// still waiting; handOff adds the relay's own unit and releases it last. A
// panic in finish is logged and contained like a handler's.
func (p *Proxy) handOff(down net.Conn, listener string, up net.Conn, finish func(relay.Result, error)) {
	p.wg.Add(1)
	var request, response *atomic.Int64 // live byte counts, only for a listed connection
	if p.cfg.ListConnections {
		request, response = p.live.Counters(down, up)
	}
	p.relays.Start(down, up, request, response, func(res relay.Result, err error) {
		defer p.wg.Done()
		defer p.forget(down)
		defer p.containPanic(down, listener)
		up.Close()
		down.Close()
		finish(res, err)
	})
}

// track registers an accepted connection and counts it in open; it reports
// false once the proxy has force-closed its connections.
func (p *Proxy) track(c net.Conn, open prometheus.Gauge) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return false
	}
	p.conns[c] = open
	open.Inc()
	return true
}

// untrack closes an accepted connection and forgets it.
func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.forget(c)
}

// forget drops c from the tracked connections, if it is one.
func (p *Proxy) forget(c net.Conn) {
	p.mu.Lock()
	if open, ok := p.conns[c]; ok {
		delete(p.conns, c)
		open.Dec()
	}
	p.mu.Unlock()
}

// closeListeners closes every listener. One whose loop is parked has no
// goroutine to see the close: its unit of the wait group is released here.
func (p *Proxy) closeListeners() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.acceptors {
		if a.watch.Unpark() {
			p.wg.Done()
		}
	}
	for _, l := range p.listeners {
		l.Close()
	}
}

// Shutdown stops accepting at once, lets connections drain until ctx is
// done, then force-closes the rest (SPEC §8.4). HBONE server connections get
// a graceful GOAWAY. It returns once every connection has ended.
func (p *Proxy) Shutdown(ctx context.Context) error {
	// A connection Accept returned just before the listeners closed is still
	// served, inside the drain: only forceClose stops tracking, so a client
	// the kernel accepted never sees its connection closed unserved (an
	// upgrade overlap, where the new gozt takes every later connection).
	p.closeListeners()

	drained := make(chan struct{})
	go func() {
		if p.dns != nil {
			_ = p.dns.Shutdown(ctx)
		}
		p.hbone.Shutdown(ctx)
		p.waitConns(ctx)
		close(drained)
	}()
	select {
	case <-drained:
	case <-ctx.Done():
	}
	p.forceClose()
	<-drained
	p.wg.Wait()
	p.accept.closeSpare()
	_ = p.relays.Close() // nothing is parked any more: every copy has ended
	return p.pool.Close()
}

// waitConns waits until no accepted connection remains or ctx is done.
func (p *Proxy) waitConns(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// forceClose ends every remaining connection.
func (p *Proxy) forceClose() {
	p.cancel()
	p.hbone.Close()
	p.mu.Lock()
	p.closing = true
	for c := range p.conns {
		_ = p.relays.CloseConn(c) // a relayed socket may be parked: see abortLeg
	}
	p.mu.Unlock()
}

// localWorkload returns the workload this proxy serves, or nil.
func (p *Proxy) localWorkload(snap *state.Snapshot) *state.Workload {
	if p.cfg.Local != nil {
		return p.cfg.Local(snap)
	}
	return snap.WorkloadByUID(p.cfg.WorkloadUID)
}

// DNS is the workload's DNS proxy, or nil.
func (p *Proxy) DNS() *dns.Server { return p.dns }

// ParkedConns returns how many of the proxy's connections are idle with
// their TCP leg parked in its relay Poller, holding no goroutine (issue 16).
func (p *Proxy) ParkedConns() int { return p.relays.Parked() }

// UID is the uid of the workload this proxy serves.
func (p *Proxy) UID() string { return p.cfg.WorkloadUID }

// watchPolicy registers a live inbound connection with the connection
// manager. When a policy change denies it, or its workload is removed, both
// legs are aborted (abortLeg) and the connection is recorded with flag DENY. The returned func unregisters and
// turns the copy's error into the close reason.
func (p *Proxy) watchPolicy(info connmgr.Info, rec *telemetry.Record, legs ...net.Conn) func(error) error {
	if p.cfg.ConnMgr == nil {
		return func(err error) error { return err }
	}
	var closed atomic.Pointer[error]
	unregister := p.cfg.ConnMgr.Register(info, func(err error) {
		closed.Store(&err)
		for _, l := range legs {
			p.abortLeg(l)
		}
	})
	return func(err error) error {
		unregister()
		if reason := closed.Load(); reason != nil {
			rec.SetFlag(telemetry.FlagDeny)
			p.noteRecheckDenial(info)
			return *reason
		}
		return err
	}
}

// abortLeg closes c so that its peer reads a reset, not an orderly end: an
// HBONE stream is reset with CONNECT_ERROR, which the far proxy turns into a
// TCP reset (proxy/relay), and a TCP socket is closed with SO_LINGER 0. A
// connection the connection manager closes, because a policy now denies it
// or its destination workload is gone, is cut short, and must not look
// complete to either application (TESTPLAN F20).
//
// The close goes through the relay's Poller: nothing waits on a parked idle
// socket, so a plain Close would not end its copy.
func (p *Proxy) abortLeg(c net.Conn) {
	if a, ok := c.(interface{ Abort() error }); ok {
		_ = a.Abort() // fails only on a stream already closed
		return
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0) // the close below is all that is left either way
	}
	_ = p.relays.CloseConn(c)
}

// localWorkloadWait is how long a connection waits for xDS to deliver the
// workload this proxy serves (SPEC §3.1 step 3, §6.4).
const localWorkloadWait = 5 * time.Second

// awaitLocalWorkload returns the latest snapshot and the local workload,
// waiting up to localWorkloadWait for it to appear.
func (p *Proxy) awaitLocalWorkload(ctx context.Context) (*state.Snapshot, *state.Workload) {
	snap := p.cfg.Store.Snapshot()
	if w := p.localWorkload(snap); w != nil {
		return snap, w
	}
	ctx, cancel := context.WithTimeout(ctx, localWorkloadWait)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return snap, nil
		case <-t.C:
		}
		snap = p.cfg.Store.Snapshot()
		if w := p.localWorkload(snap); w != nil {
			return snap, w
		}
	}
}
