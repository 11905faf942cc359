// Package istiocatest is a fake istiod certificate authority for tests: an
// in-process IstioCertificateService (gRPC over TLS) that signs CSRs with a
// certs/localca CA, records every request, and can be told to misbehave
// (errors, delays, wrong identity, broken chains, being down).
//
// A Server listens on 127.0.0.1 (NewServer) and also accepts in-memory
// connections through Dial; NewInMemoryServer has no socket at all, so it
// works inside a testing/synctest bubble.
//
//	srv := istiocatest.NewServer(t, ca, nil)
//	c, _ := istioca.New(istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(ca)})
//	srv.SetMode(istiocatest.Error(codes.Unavailable))
package istiocatest

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"crypto/tls"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// ServerName is the DNS name of the default server certificate (with
// "localhost" and 127.0.0.1), and the host of an in-memory server's Addr.
const ServerName = "istiod.istio-system.svc"

// inMemoryAddr is the Addr of a server without a socket.
const inMemoryAddr = ServerName + ":15012"

// Request is one recorded CreateCertificate request.
type Request struct {
	// Identity is the CSR's URI SAN if it is a SPIFFE workload identity,
	// else zero.
	Identity identity.Identity
	// CSR is the parsed certificate request, or nil if it did not parse
	// or its signature was bad.
	CSR *x509.CertificateRequest
	// Authorization and ClusterID are the "authorization" and "clusterid"
	// metadata values ("" if absent).
	Authorization string
	ClusterID     string
	// HasImpersonated reports whether the request metadata Struct held an
	// ImpersonatedIdentity field, and Impersonated is its string value.
	HasImpersonated bool
	Impersonated    string
	// TTL is validity_duration.
	TTL time.Duration
	// Header is all the gRPC metadata of the request.
	Header metadata.MD
	// Received is when the server got the request.
	Received time.Time
}

// Server is a fake IstioCertificateService. Its methods are safe for
// concurrent use.
type Server struct {
	pb.UnimplementedIstioCertificateServiceServer

	grpc *grpc.Server
	tcp  net.Listener // nil for an in-memory server
	mem  *memListener
	wg   sync.WaitGroup // Serve goroutines

	mu      sync.Mutex
	ca      *localca.CA
	roots   []*x509.Certificate // the root bundle answered
	mode    Mode
	modeFor map[identity.Identity]Mode
	down    bool
	conns   map[net.Conn]struct{} // open accepted connections
	reqs    []Request
}

// NewServer starts a fake CA signing with ca on 127.0.0.1:0 (and in memory,
// see Dial). tlsCfg is the server TLS configuration; if nil, ServerTLS(tb,
// ca) is used. The server stops when tb's test ends.
func NewServer(tb testing.TB, ca *localca.CA, tlsCfg *tls.Config) *Server {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("istiocatest: listen: %v", err)
	}
	return start(tb, ca, tlsCfg, lis)
}

// NewInMemoryServer is NewServer without a socket: connect with Dial as
// the client's dialer. It can run inside a testing/synctest bubble.
func NewInMemoryServer(tb testing.TB, ca *localca.CA, tlsCfg *tls.Config) *Server {
	tb.Helper()
	return start(tb, ca, tlsCfg, nil)
}

func start(tb testing.TB, ca *localca.CA, tlsCfg *tls.Config, tcp net.Listener) *Server {
	tb.Helper()
	if ca == nil {
		tb.Fatal("istiocatest: nil CA")
	}
	if tlsCfg == nil {
		tlsCfg = ServerTLS(tb, ca, ServerName, "localhost", "127.0.0.1")
	}
	s := serve(ca, tlsCfg, tcp)
	tb.Cleanup(s.Close)
	return s
}

// Serve starts a fake CA signing with ca on the TCP listener lis (which it
// takes over) with server TLS configuration tlsCfg, for a program that has
// no testing.TB: gozt bench's fake istiod. Close stops it.
func Serve(ca *localca.CA, tlsCfg *tls.Config, lis net.Listener) (*Server, error) {
	if ca == nil || tlsCfg == nil || lis == nil {
		return nil, errors.New("istiocatest: Serve needs a CA, a TLS configuration and a listener")
	}
	return serve(ca, tlsCfg, lis), nil
}

func serve(ca *localca.CA, tlsCfg *tls.Config, tcp net.Listener) *Server {
	s := &Server{
		ca:      ca,
		roots:   ca.Roots(),
		modeFor: make(map[identity.Identity]Mode),
		conns:   make(map[net.Conn]struct{}),
		tcp:     tcp,
		mem:     newMemListener(),
		grpc:    grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg))),
	}
	pb.RegisterIstioCertificateServiceServer(s.grpc, s)
	s.wg.Go(func() { s.grpc.Serve(&trackingListener{Listener: s.mem, s: s}) })
	if tcp != nil {
		s.wg.Go(func() { s.grpc.Serve(&trackingListener{Listener: tcp, s: s}) })
	}
	return s
}

// Close stops the server: it closes its listeners and connections, cancels
// the RPCs in progress and waits for its goroutines. A test's server is
// closed when the test ends.
func (s *Server) Close() {
	s.grpc.Stop()
	s.wg.Wait()
}

// Addr returns the TCP address ("127.0.0.1:port"), or for an in-memory
// server ServerName + ":15012".
func (s *Server) Addr() string {
	if s.tcp == nil {
		return inMemoryAddr
	}
	return s.tcp.Addr().String()
}

// URL returns "https://" + Addr(), the form of CA_ADDRESS.
func (s *Server) URL() string { return "https://" + s.Addr() }

// Dial opens an in-memory connection to the server, whatever addr says (it
// has the signature of istioca.Config.Dialer). While the server is down it
// fails with ECONNREFUSED.
func (s *Server) Dial(ctx context.Context, addr string) (net.Conn, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: syscall.ECONNREFUSED}
	}
	return s.mem.dial(ctx)
}

// SetMode sets how the server answers every identity without its own mode
// (SetModeFor).
func (s *Server) SetMode(m Mode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
}

// SetModeFor sets how the server answers requests for id (the CSR's
// identity), overriding SetMode.
func (s *Server) SetModeFor(id identity.Identity, m Mode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.modeFor[id] = m
}

// SetCA makes the server sign with ca and answer roots as the root bundle
// (the last element of every chain); nil roots means ca.Roots(). For a root
// rotation, answer the old and new roots together.
func (s *Server) SetCA(ca *localca.CA, roots []*x509.Certificate) {
	if roots == nil {
		roots = ca.Roots()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ca, s.roots = ca, append([]*x509.Certificate(nil), roots...)
}

// SetDown takes the server down (true: every open connection is closed,
// new TCP connections are closed at once and Dial is refused) or brings it
// back (false).
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	var open []net.Conn
	if down {
		for c := range s.conns {
			open = append(open, c)
		}
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// Requests returns the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// CreateCertificate implements IstioCertificateService.
func (s *Server) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	r, csrErr := record(ctx, req)
	s.mu.Lock()
	s.reqs = append(s.reqs, r)
	m, ok := s.modeFor[r.Identity]
	if !ok {
		m = s.mode
	}
	ca, roots := s.ca, s.roots
	s.mu.Unlock()

	if m.delay > 0 {
		t := time.NewTimer(m.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if m.kind == kindError {
		return nil, status.Errorf(m.code, "istiocatest: programmed error %v", m.code)
	}
	if csrErr != nil {
		return nil, status.Errorf(codes.InvalidArgument, "istiocatest: bad CSR: %v", csrErr)
	}
	chain, err := answer(ctx, m.kind, ca, roots, r, time.Now())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "istiocatest: %v", err)
	}
	return &pb.IstioCertificateResponse{CertChain: chain}, nil
}

// record extracts what a test may want to check from one request.
func record(ctx context.Context, req *pb.IstioCertificateRequest) (Request, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r := Request{
		Authorization: first(md.Get("authorization")),
		ClusterID:     first(md.Get("clusterid")),
		TTL:           time.Duration(req.GetValidityDuration()) * time.Second,
		Header:        md.Copy(),
		Received:      time.Now(),
	}
	if v, ok := req.GetMetadata().GetFields()["ImpersonatedIdentity"]; ok {
		r.HasImpersonated, r.Impersonated = true, v.GetStringValue()
	}
	csr, err := parseCSR(req.GetCsr())
	if err != nil {
		return r, err
	}
	r.CSR = csr
	if len(csr.URIs) == 1 {
		r.Identity, _ = identity.Parse(csr.URIs[0].String())
	}
	return r, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// trackingListener records accepted connections so SetDown can close them,
// and closes new ones while the server is down.
type trackingListener struct {
	net.Listener
	s *Server
}

func (l *trackingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.s.mu.Lock()
		down := l.s.down
		if !down {
			l.s.conns[c] = struct{}{}
		}
		l.s.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		return &trackedConn{Conn: c, s: l.s}, nil
	}
}

// trackedConn forgets itself when closed.
type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c.Conn)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// memListener is a net.Listener of in-memory (net.Pipe) connections.
type memListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: syscall.ECONNREFUSED}
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr{} }

type memAddr struct{}

func (memAddr) Network() string { return "pipe" }
func (memAddr) String() string  { return inMemoryAddr }

// String describes m, for test failure messages.
func (m Mode) String() string {
	s := kindNames[m.kind]
	if m.kind == kindError {
		s = fmt.Sprintf("Error(%v)", m.code)
	}
	if m.delay > 0 {
		s = fmt.Sprintf("Delay(%v)", m.delay)
	}
	return s
}
