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

	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
	"github.com/gozt/gozt/state"
)

// Port is the DNS proxy's port (SPEC §1.1).
const Port = 15053

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
	// listeners (admission.Listener). The listener it returns must return
	// from Accept only admitted connections, and no error but the one of a
	// closed listener: it handles a failed accept itself (backing off,
	// shedding), since miekg/dns retries a temporary error such as EMFILE
	// at once, for ever. Nil admits every connection.
	AdmitTCP func(net.Listener) net.Listener
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
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	// lifetime is cancelled by Shutdown: it ends the waits and upstream
	// exchanges of queries in flight.
	lifetime context.Context
	cancel   context.CancelFunc

	mu      sync.Mutex
	servers []*listener // bound by Listen, read-only once Serve starts
	serving bool        // Serve was called
	closed  bool        // Shutdown was called

	wg sync.WaitGroup // the miekg/dns servers' loops

	inFlight chan struct{} // one token per query being answered
	tcpSlots chan struct{} // one token per TCP connection open
	// refusedLog is when a refused TCP connection was last logged
	// (UnixNano), or 0.
	refusedLog atomic.Int64
}

// listener is one bound socket and the miekg/dns server serving it.
type listener struct {
	srv     *dns.Server
	addr    net.Addr
	network string
	started chan struct{} // closed once the server accepts Shutdown
	done    chan struct{} // closed when its serve loop returned
	err     error         // the serve loop's failure, once done is closed
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
	s := &Server{cfg: cfg, log: cfg.Logger, inFlight: make(chan struct{}, limit), tcpSlots: make(chan struct{}, conns)}
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
				closeSocket(l.srv)
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
		bound = append(bound,
			s.newListener(&dns.Server{PacketConn: pc}, pc.LocalAddr(), "udp"),
			s.newListener(&dns.Server{Listener: s.tcpListener(tl)}, tl.Addr(), "tcp"))
	}
	if len(bound) == 0 {
		return fmt.Errorf("dns: no address to listen on in %v", s.cfg.Addrs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("dns: listen after shutdown")
	}
	s.servers = append(s.servers, bound...)
	return nil
}

// newListener completes srv with the handler and limits of a DNS proxy
// listener.
func (s *Server) newListener(srv *dns.Server, addr net.Addr, network string) *listener {
	l := &listener{srv: srv, addr: addr, network: network, started: make(chan struct{}), done: make(chan struct{})}
	srv.Handler = s.handler(network)
	srv.MsgAcceptFunc = acceptQueries
	srv.DecorateReader = func(r dns.Reader) dns.Reader { return screen{Reader: r, self: addrPort(addr), busy: s.busy} }
	srv.NotifyStartedFunc = func() { close(l.started) }
	srv.ReadTimeout = requestTimeout
	if network == "udp" {
		// miekg/dns sets this deadline on each read of the one UDP
		// socket and reads again when it passes: an idle listener woke
		// every 5 s for nothing, two per pod in shared mode (gozt
		// bench's node scenario, bench/NOTES.md). Shutdown does not
		// need it: it moves the deadline into the past itself.
		srv.ReadTimeout = udpReadWait
	}
	srv.WriteTimeout = requestTimeout
	srv.IdleTimeout = func() time.Duration { return requestTimeout }
	return l
}

// udpReadWait is how long a UDP listener's read waits before it is
// started again: long enough that an idle listener costs nothing.
const udpReadWait = 24 * time.Hour

// busy reports whether the in-flight bound is full: a query read now would
// be answered SERVFAIL as busy.
func (s *Server) busy() bool { return len(s.inFlight) == cap(s.inFlight) }

// noIPv6 reports whether err is binding an IPv6 address where IPv6 is off.
func noIPv6(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT)
}

func closeSocket(srv *dns.Server) {
	if srv.PacketConn != nil {
		srv.PacketConn.Close()
	}
	if srv.Listener != nil {
		srv.Listener.Close()
	}
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
	for _, l := range s.servers {
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
// second time). Shutdown still waits for what Start started.
func (s *Server) Start() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.serving {
		return false
	}
	s.serving = true
	for _, l := range s.servers {
		s.wg.Add(1)
		go s.serveListener(l)
	}
	return true
}

// Wait returns once the loops Start started have ended, with their
// failures other than the shutdown itself.
func (s *Server) Wait() error {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, l := range s.servers {
		errs = append(errs, l.err)
	}
	return errors.Join(errs...)
}

// serveListener runs one miekg/dns server until it is shut down.
func (s *Server) serveListener(l *listener) {
	defer s.wg.Done()
	defer close(l.done)
	if err := l.srv.ActivateAndServe(); err != nil && s.lifetime.Err() == nil {
		l.err = fmt.Errorf("dns: serve %s %v: %w", l.network, l.addr, err)
		s.log.Warn("dns listener failed", "addr", l.addr, "error", err)
	}
}

// Shutdown stops the listeners, lets queries in flight finish until ctx is
// done, then abandons their upstream exchanges. It returns once Serve's
// loops have ended.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	serving, servers := s.serving, s.servers
	s.mu.Unlock()
	if !serving {
		s.cancel()
		for _, l := range servers {
			closeSocket(l.srv)
		}
		return nil
	}
	var wg sync.WaitGroup
	for _, l := range servers {
		wg.Go(func() {
			select {
			case <-l.started:
				_ = l.srv.ShutdownContext(ctx)
			case <-l.done:
			}
		})
	}
	wg.Wait()
	s.cancel()
	s.wg.Wait()
	return nil
}

// handler answers the queries of one listener.
func (s *Server) handler(network string) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		resp := s.resolve(s.lifetime, req, network)
		if network == "udp" {
			resp.Truncate(udpSize(req))
		}
		if err := w.WriteMsg(resp); err != nil {
			s.log.Debug("dns reply failed", "src.addr", w.RemoteAddr(), "error", err)
		}
	})
}

// udpSize is the largest UDP response req's sender accepts (RFC 6891 §6.2.5).
func udpSize(req *dns.Msg) int {
	if opt := req.IsEdns0(); opt != nil {
		return max(int(opt.UDPSize()), dns.MinMsgSize)
	}
	return dns.MinMsgSize
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
	select {
	case s.inFlight <- struct{}{}:
		defer func() { <-s.inFlight }()
	default:
		s.log.Debug("dns proxy busy: query refused", "limit", cap(s.inFlight))
		return errorReply(req, dns.RcodeServerFailure)
	}
	if resp := precheck(req); resp != nil {
		return resp
	}
	snap, client := s.cfg.Local(ctx)
	return s.cfg.Resolver.answer(ctx, query{snap: snap, client: client, req: req, proto: network, dial: s.dial})
}

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
