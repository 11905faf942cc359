package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/proxy/sockwait"
	"github.com/gozt/gozt/state"
)

// Port is the DNS proxy's port (SPEC §1.1).
const Port = 15053

// DefaultIdle is ServerConfig.Idle when zero.
const DefaultIdle = time.Second

// requestTimeout bounds reading a TCP request and writing any response, as
// ztunnel's 5 s TCP request timeout.
const requestTimeout = 5 * time.Second

// errNoAddress is a lookup that found the name without an address.
var errNoAddress = errors.New("no address")

// ServerConfig configures one workload's Server.
type ServerConfig struct {
	// Resolver answers the queries. Required.
	Resolver *Resolver
	// Local returns the current snapshot and the workload this server
	// serves, the source of every query, waiting for it as long as it sees
	// fit (bounded by ctx); a nil workload answers SERVFAIL. Required.
	Local func(ctx context.Context) (*state.Snapshot, *state.Workload)
	// Addrs are the addresses to listen on, each over UDP and TCP.
	Addrs []netip.AddrPort
	// InNetns, if non-nil, runs functions inside the workload's network
	// namespace: the listeners and every upstream socket are made there
	// (shared mode). Nil means the current one.
	InNetns netns.Func
	// Mark, if non-zero, is set as SO_MARK on the listeners and upstream
	// sockets, so the pod's redirect rules skip them.
	Mark uint32
	// ReusePort sets SO_REUSEPORT on the listeners (INPOD_PORT_REUSE).
	ReusePort bool
	// MaxInFlight caps the queries this server answers at once; one more
	// gets SERVFAIL at once, so a flood from one pod holds a bounded number
	// of goroutines and upstream sockets. If zero 256.
	MaxInFlight int
	// MaxTCPConns caps the TCP connections this server holds open at once;
	// one more is reset at once and counted in
	// gozt_dns_tcp_connections_refused_total, so one pod cannot hold the
	// node-wide process's descriptors for the request timeout per
	// connection. If zero 64.
	MaxTCPConns int
	// AdmitTCP, if non-nil, wraps each TCP listener before the bound, so
	// that DNS accepts pass the admission control of the proxy's other
	// listeners, which handles a failed accept itself (backing off,
	// shedding). Nil admits every connection, and a failed accept is
	// backed off. Either way the server sets the listener's Idle.
	AdmitTCP func(net.Listener) *admission.Listener
	// Sockets, if non-nil, is the process's set of parked sockets: a
	// socket of this server with no query for Idle is parked there, its
	// loop ended, and a loop starts again when the socket is readable, so
	// that an idle pod's DNS proxy holds no goroutine (issue 40). Start
	// parks every socket at once. Nil parks nothing: each socket's loop
	// waits on its goroutine.
	Sockets *sockwait.Set
	// Idle is how long a socket has no query, or a TCP listener no
	// connection, before it is parked (Sockets); up to twice that, as a
	// loop sets its deadline once per Idle, not per read. If zero
	// DefaultIdle.
	Idle time.Duration
	// OptionalIPv6 skips an IPv6 address that cannot be bound because the
	// namespace has no IPv6, as ztunnel binds localhost in a pod without
	// IPv6 on 127.0.0.1 only.
	OptionalIPv6 bool
	// Logger receives operational logs; if nil they are discarded.
	Logger *slog.Logger
}

// Server is one workload's DNS proxy: UDP and TCP listeners whose queries
// the Resolver answers as coming from that workload.
//
// Listen binds, Serve serves until Shutdown, Shutdown stops both; LookupIP
// answers in-process lookups (SOCKS5) through the same path.
//
// Each bound socket has one loop (udp.go, tcpconns.go): a UDP socket's
// reads datagrams and answers each on a goroutine of its own, a TCP
// listener's accepts connections and serves each on a goroutine of its
// own, one query after the other. miekg/dns packs and unpacks the
// messages; the loops are the server's own.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	// lifetime is cancelled by Shutdown: it ends the waits and upstream
	// exchanges of queries in flight.
	lifetime context.Context
	cancel   context.CancelFunc
	// stop is closed by the first Shutdown: the loops stop reading and
	// accepting, and each TCP connection ends once the query it is
	// answering is.
	stop chan struct{}

	mu        sync.Mutex
	listeners []*listener // bound by Listen, read-only once Serve starts
	serving   bool        // Serve was called
	closed    bool        // Shutdown was called; stop is closed
	// conns are the TCP connections being served, whose reads Shutdown
	// interrupts; none is added once closed.
	conns map[net.Conn]struct{}

	// wg counts the loops, the queries being answered over UDP and the TCP
	// connections being served: Shutdown waits for all of them.
	wg sync.WaitGroup

	inFlight chan struct{} // one token per query being answered
	tcpSlots chan struct{} // one token per TCP connection open
	// refusedLog is when a refused TCP connection was last logged
	// (UnixNano), or 0.
	refusedLog atomic.Int64
}

// listener is one bound socket, UDP or TCP, and the state of its loop.
//
// Its loop runs on one goroutine at a time: from Start, or, once it has
// parked the socket, from the wake of ServerConfig.Sockets. Each holds
// one count of the Server's WaitGroup, from Start until the loop ends for
// good (Shutdown, a failure): a parked socket holds its count, which
// Shutdown gives back if Unpark reports that the wake never runs.
type listener struct {
	network string         // "udp" or "tcp"
	addr    net.Addr       // the bound address
	self    netip.AddrPort // addr, for answerable
	udp     *net.UDPConn   // the socket, for "udp"
	accept  net.Listener   // the socket, for "tcp": admitted (AdmitTCP), then bounded
	watch   *sockwait.Watch
	loop    func() // readUDP(l) or acceptTCP(l): Start's and the wake's

	// Owned by the loop; read by others once the WaitGroup is done.
	err       error // the loop's failure
	deadlines int   // read deadlines a UDP loop set (tests)
}

// close closes l's socket, taking it out of the set of parked sockets
// first.
func (l *listener) close() {
	l.watch.Unpark()
	if l.udp != nil {
		l.udp.Close()
	}
	if l.accept != nil {
		l.accept.Close()
	}
}

// NewServer returns a Server that has not bound anything yet.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Resolver == nil || cfg.Local == nil {
		panic("dns: NewServer needs Resolver and Local")
	}
	limit := cfg.MaxInFlight
	if limit <= 0 {
		limit = 256
	}
	conns := cfg.MaxTCPConns
	if conns <= 0 {
		conns = defaultMaxTCPConns
	}
	s := &Server{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), conns: map[net.Conn]struct{}{},
		inFlight: make(chan struct{}, limit), tcpSlots: make(chan struct{}, conns)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.lifetime, s.cancel = context.WithCancel(context.Background())
	return s
}

// Listen binds a UDP and a TCP socket on every address, inside the
// workload's network namespace (Config.InNetns). On failure it closes what
// it bound and returns an error naming the address.
func (s *Server) Listen(ctx context.Context) error { return s.listen(ctx, s.inNetns) }

// ListenHere is Listen for a caller already running inside the workload's
// network namespace (a Proxy making all of a pod's sockets in one entry):
// the sockets are made on the calling thread, in whatever namespace it is.
func (s *Server) ListenHere(ctx context.Context) error {
	return s.listen(ctx, func(fn func() error) error { return fn() })
}

// listen is Listen, making each address's sockets through in.
func (s *Server) listen(ctx context.Context, in func(func() error) error) (err error) {
	lc := sockopt.ListenConfig(sockopt.Options{ReusePort: s.cfg.ReusePort, Mark: s.cfg.Mark})
	var bound []*listener
	defer func() {
		if err != nil {
			for _, l := range bound {
				l.close()
			}
		}
	}()
	for _, ap := range s.cfg.Addrs {
		addr := ap.String()
		var pc net.PacketConn
		var tl net.Listener
		err := in(func() (err error) {
			if pc, err = lc.ListenPacket(ctx, "udp", addr); err != nil {
				return err
			}
			if tl, err = lc.Listen(ctx, "tcp", pc.LocalAddr().String()); err != nil {
				pc.Close()
			}
			return err
		})
		if err != nil && s.cfg.OptionalIPv6 && ap.Addr().Is6() && noIPv6(err) {
			s.log.Debug("dns proxy: no IPv6 in the namespace; not listening on it", "addr", addr, "error", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("dns: listen on %s: %w", addr, err)
		}
		u, t, err := s.newListeners(pc.(*net.UDPConn), tl.(*net.TCPListener))
		if err != nil {
			pc.Close()
			tl.Close()
			return fmt.Errorf("dns: listen on %s: %w", addr, err)
		}
		bound = append(bound, u, t)
	}
	if len(bound) == 0 {
		return fmt.Errorf("dns: no address to listen on in %v", s.cfg.Addrs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("dns: listen after shutdown")
	}
	s.listeners = append(s.listeners, bound...)
	return nil
}

// newListeners returns the listeners of the UDP and TCP sockets bound to
// one address.
func (s *Server) newListeners(pc *net.UDPConn, tl *net.TCPListener) (udp, tcp *listener, err error) {
	urc, err := pc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	trc, err := tl.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	udp = &listener{network: "udp", addr: pc.LocalAddr(), self: addrPort(pc.LocalAddr()), udp: pc,
		watch: s.cfg.Sockets.Watch(urc)}
	tcp = &listener{network: "tcp", addr: tl.Addr(), self: addrPort(tl.Addr()), accept: s.tcpListener(tl),
		watch: s.cfg.Sockets.Watch(trc)}
	udp.loop = func() { s.readUDP(udp) }
	tcp.loop = func() { s.acceptTCP(tcp) }
	return udp, tcp, nil
}

// idle is how long a socket waits before it is parked, or 0 if sockets
// are not parked.
func (s *Server) idle() time.Duration {
	switch {
	case s.cfg.Sockets == nil:
		return 0
	case s.cfg.Idle > 0:
		return s.cfg.Idle
	}
	return DefaultIdle
}

// noIPv6 reports whether err is binding an IPv6 address where IPv6 is off.
func noIPv6(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT)
}

func (s *Server) inNetns(fn func() error) error {
	if s.cfg.InNetns == nil {
		return fn()
	}
	return s.cfg.InNetns.Run(fn)
}

// Addrs returns the bound UDP and TCP addresses.
func (s *Server) Addrs() (udp, tcp []net.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		if l.network == "udp" {
			udp = append(udp, l.addr)
		} else {
			tcp = append(tcp, l.addr)
		}
	}
	return udp, tcp
}

// Serve serves the bound sockets until Shutdown and returns after every
// query in flight has been answered. It returns the first failure of a
// serve loop other than the shutdown itself.
func (s *Server) Serve() error {
	if !s.Start() {
		return nil
	}
	return s.Wait()
}

// Start serves the bound sockets until Shutdown, as Serve does, without
// waiting: it reports whether it started them (not after Shutdown, nor a
// second time). It parks each socket (ServerConfig.Sockets), or starts its
// loop, and nothing else; Shutdown still waits for what Start started.
func (s *Server) Start() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.serving {
		return false
	}
	s.serving = true
	for _, l := range s.listeners {
		s.wg.Add(1)
		if !s.park(l) {
			go l.loop()
		}
	}
	return true
}

// park parks l's socket, whose loop is not running or about to end, and
// reports whether it did: then the loop ends without giving back its
// count of the WaitGroup, which its wake takes over; if not, the loop
// goes on (or starts) on a goroutine of its own.
func (s *Server) park(l *listener) bool {
	return l.watch.Park(l.loop)
}

// Wait returns once the loops Start started have ended, and the queries
// they read have been answered, with the loops' failures other than the
// shutdown itself.
func (s *Server) Wait() error {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, l := range s.listeners {
		errs = append(errs, l.err)
	}
	return errors.Join(errs...)
}

// stopping reports whether Shutdown has begun.
func (s *Server) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// failed records the failure of l's loop, which then ends, and closes
// l's socket, which no loop reads any more. The loop still gives back its
// count of the WaitGroup.
func (s *Server) failed(l *listener, err error) {
	l.err = fmt.Errorf("dns: serve %s %v: %w", l.network, l.addr, err)
	s.log.Warn("dns listener failed", "addr", l.addr, "error", err)
	l.close()
}

// aLongTimeAgo is a deadline in the past: it ends a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

// Shutdown stops the listeners, lets queries in flight finish until ctx is
// done, then abandons their upstream exchanges. It returns once Serve's
// loops have ended and the queries they read have been answered.
//
// A loop checks stop after it sets a deadline of its own, and Shutdown
// sets its deadlines after it closes stop, so that a loop either sees
// stop or has its deadline overridden.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.closed
	if first {
		s.closed = true
		close(s.stop)
	}
	serving, listeners := s.serving, s.listeners
	if first && serving {
		for c := range s.conns {
			_ = c.SetReadDeadline(aLongTimeAgo) // the query being answered, if any, is written
		}
	}
	s.mu.Unlock()
	if !serving {
		s.cancel()
		for _, l := range listeners {
			l.close()
		}
		return nil
	}
	if first {
		for _, l := range listeners {
			if l.watch.Unpark() {
				s.wg.Done() // parked: its loop is over, and its wake never runs
			}
			if l.udp != nil {
				// Not closed yet: the queries in flight write their replies.
				_ = l.udp.SetReadDeadline(aLongTimeAgo)
			} else {
				l.accept.Close()
			}
		}
	}
	// Once drained, or at ctx's end, close the UDP sockets and end the
	// upstream exchanges left.
	var once sync.Once
	end := func() {
		once.Do(func() {
			for _, l := range listeners {
				l.close()
			}
			s.cancel()
		})
	}
	stopEnd := context.AfterFunc(ctx, end)
	s.wg.Wait()
	stopEnd()
	end()
	return nil
}

// resolve answers req, received over network, as coming from the served
// workload. A panic answers SERVFAIL.
func (s *Server) resolve(ctx context.Context, req *dns.Msg, network string) (resp *dns.Msg) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("dns handler panicked", "panic", r)
			resp = errorReply(req, dns.RcodeServerFailure)
		}
	}()
	// Every reply, FORMERR and NOTIMP too, is made inside the bound.
	if !s.enter() {
		return errorReply(req, dns.RcodeServerFailure)
	}
	defer s.leave()
	if resp := precheck(req); resp != nil {
		return resp
	}
	snap, client := s.cfg.Local(ctx)
	return s.cfg.Resolver.answer(ctx, query{snap: snap, client: client, req: req, proto: network, dial: s.dial})
}

// enter takes a place in the in-flight bound for one query, reporting
// whether there was one; if not, the query is to be answered SERVFAIL as
// busy. A query that entered calls leave once answered.
func (s *Server) enter() bool {
	select {
	case s.inFlight <- struct{}{}:
		return true
	default:
		s.log.Debug("dns proxy busy: query refused", "limit", cap(s.inFlight))
		return false
	}
}

// leave frees the place in the in-flight bound a query took with enter.
func (s *Server) leave() { <-s.inFlight }

// dial makes an upstream socket inside the workload's network namespace,
// with the mark.
func (s *Server) dial(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error) {
	d := sockopt.Dialer(netip.Addr{}, sockopt.Options{Mark: s.cfg.Mark})
	if s.cfg.InNetns == nil {
		return d.DialContext(ctx, network, addr.String())
	}
	if network == "tcp" {
		c, err := sockopt.DialInNetns(ctx, s.cfg.InNetns, d, addr)
		if err != nil {
			return nil, err // not a typed-nil *net.TCPConn
		}
		return c, nil
	}
	var c net.Conn
	err := s.cfg.InNetns.Run(func() (err error) {
		c, err = d.DialContext(ctx, network, addr.String())
		return err
	})
	return c, err
}

// LookupIP resolves name for the served workload as a query from it would
// be (SPEC §10.2: SOCKS5 domain targets): an A query, or AAAA when v6, and
// the first address of the answer; a name that exists without an A record
// is asked for its AAAA too. It ends when ctx is done or the server shuts
// down.
func (s *Server) LookupIP(ctx context.Context, name string, v6 bool) (netip.Addr, error) {
	if _, ok := dns.IsDomainName(name); !ok || name == "" {
		return netip.Addr{}, fmt.Errorf("dns: lookup %q: not a domain name", name)
	}
	// Shutdown ends the lookup too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.lifetime, cancel)
	defer stop()
	if v6 {
		return s.lookupFamily(ctx, name, dns.TypeAAAA)
	}
	ip, err := s.lookupFamily(ctx, name, dns.TypeA)
	if errors.Is(err, errNoAddress) {
		// No A record but possibly an AAAA: answer over IPv6 rather
		// than fail (gozt; ztunnel#2054 is open). An IPv6 client keeps
		// its own family only, as in ztunnel.
		return s.lookupFamily(ctx, name, dns.TypeAAAA)
	}
	return ip, err
}

// lookupFamily resolves name's first address of type qtype (A or AAAA),
// through the same path as a query of the workload; errNoAddress means the
// name exists without one.
func (s *Server) lookupFamily(ctx context.Context, name string, qtype uint16) (netip.Addr, error) {
	req := new(dns.Msg)
	req.SetQuestion(dns.Fqdn(name), qtype)
	resp := s.resolve(ctx, req, "udp")
	if resp.Rcode != dns.RcodeSuccess {
		return netip.Addr{}, fmt.Errorf("dns: lookup %s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(rr.A); ok {
				return a.Unmap(), nil
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(rr.AAAA); ok {
				return a, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("dns: lookup %s: %w", name, errNoAddress)
}
