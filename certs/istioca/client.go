// Package istioca is the client of istiod's certificate authority: it
// implements certs.Issuer by sending a CSR to
// istio.v1.auth.IstioCertificateService/CreateCertificate over gRPC with TLS
// (SPEC §6.2) and validating the chain that comes back.
//
// Each Issue makes a fresh ECDSA P-256 key and a CSR with an empty subject
// and exactly one (critical) URI SAN, the requested SPIFFE identity. The
// request carries the bearer token (read again for every request), the
// cluster id and any extra headers as gRPC metadata, and in shared mode the
// requested identity as ImpersonatedIdentity. The response's first element
// is the leaf, the last one the root bundle and those between are
// intermediates; a response is refused unless the leaf is for exactly the
// requested identity, is valid now, holds our key and chains to the
// returned roots.
//
// Only cmd/gozt imports this package; tests use istiocatest's fake server.
//
//	c, err := istioca.New(istioca.Config{
//		Address: "https://istiod.istio-system.svc:15012",
//		TLS:     istioca.TLSConfig(roots, "istiod.istio-system.svc", os.Getenv("ALT_CA_HOSTNAME")),
//		Token:   istioca.TokenFile("/var/run/secrets/tokens/istio-token"),
//		ClusterID: "Kubernetes",
//	})
//	m := certs.NewManager(certs.ManagerConfig{Issuer: c})
package istioca

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/istiod"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
)

// Config configures a Client.
type Config struct {
	// Address is the CA's address, "https://host:port" (CA_ADDRESS). A
	// bare "host:port" is accepted and means https. Any other scheme is an
	// error: the CA is never spoken to in plaintext.
	Address string
	// TLS is the client TLS configuration (roots from CA_ROOT_CA, server
	// name or ALT_CA_HOSTNAME); see TLSConfig. Required. A config that
	// skips verification without its own VerifyConnection or
	// VerifyPeerCertificate is refused.
	TLS *tls.Config
	// Token returns the bearer token; it is called for every request, so
	// a rotated token file is picked up (see TokenFile). If nil, no
	// authorization header is sent.
	Token func() (string, error)
	// ClusterID is sent as the "clusterid" header (CLUSTER_ID). If empty,
	// the header is omitted.
	ClusterID string
	// Headers are extra gRPC metadata sent with every request
	// (CA_HEADER_<NAME>=value). Names are lower-cased; "authorization",
	// "clusterid", pseudo-headers and "grpc-" names are refused.
	Headers map[string]string
	// TTL is the requested certificate validity (SECRET_TTL), sent in
	// whole seconds. If zero, 24h is used.
	TTL time.Duration
	// Impersonate, in shared mode, asks for each identity on behalf of the
	// node's workloads: the request metadata carries ImpersonatedIdentity =
	// the requested SPIFFE id. Off in dedicated mode.
	Impersonate bool
	// Dialer opens the connection to Address's host:port. If nil, gRPC's
	// default TCP dialer is used.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// Timeout bounds one CreateCertificate call (connection included). If
	// zero, 30s is used.
	Timeout time.Duration
}

const (
	defaultTTL     = 24 * time.Hour
	defaultTimeout = 30 * time.Second
)

func (c *Config) ttl() time.Duration {
	if c.TTL == 0 {
		return defaultTTL
	}
	return c.TTL
}

func (c *Config) timeout() time.Duration {
	if c.Timeout <= 0 {
		return defaultTimeout
	}
	return c.Timeout
}

// Metadata keys of a request (SPEC §6.2).
const (
	mdAuthorization = istiod.KeyAuthorization
	mdClusterID     = istiod.KeyClusterID
	// ImpersonatedIdentityKey is the field of the request's metadata Struct
	// that names the identity requested on a workload's behalf. istiod's
	// CreateCertificate (istio security/pkg/server/ca/server.go) then signs
	// that identity instead of the caller's, if its node authorizer allows.
	ImpersonatedIdentityKey = "ImpersonatedIdentity"
)

// Client requests workload certificates from istiod's CA. It is safe for
// concurrent use; concurrent Issue calls share one gRPC connection.
type Client struct {
	cfg     Config
	ttlSecs int64
	headers []string // extra metadata, key/value pairs
	target  string   // gRPC target
	opts    []grpc.DialOption

	cas caCache // the CA part of responses' chains, parsed once

	mu     sync.Mutex
	conn   *grpc.ClientConn // the current channel, replaced when it fails (channel.go)
	closed bool
}

var _ certs.Issuer = (*Client)(nil)

// New checks cfg and returns a Client. It does not connect: the connection
// is made by the first Issue and re-made as needed.
func New(cfg Config) (*Client, error) {
	target, err := istiod.HostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("istioca: CA %w", err)
	}
	if err := checkTLS(cfg.TLS); err != nil {
		return nil, fmt.Errorf("istioca: %w", err)
	}
	ttl := cfg.ttl()
	if ttl < time.Second {
		return nil, fmt.Errorf("istioca: TTL %v: want at least 1s", cfg.TTL)
	}
	headers, err := istiod.Headers(cfg.Headers)
	if err != nil {
		return nil, fmt.Errorf("istioca: %w", err)
	}
	if !istiod.ValidValue(cfg.ClusterID) {
		return nil, fmt.Errorf("istioca: cluster id %q: must be printable ASCII", cfg.ClusterID)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS)),
	}
	if cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(cfg.Dialer))
	}
	c := &Client{
		cfg:     cfg,
		ttlSecs: int64(ttl / time.Second),
		headers: headers,
		// passthrough: hand host:port to the dialer as is (no gRPC DNS
		// resolver goroutines; net.Dial resolves on every connect).
		target: "passthrough:///" + target,
		opts:   opts,
	}
	if c.conn, err = grpc.NewClient(c.target, c.opts...); err != nil {
		return nil, fmt.Errorf("istioca: %w", err)
	}
	return c, nil
}

// checkTLS refuses a missing TLS config or one that would accept any server.
func checkTLS(c *tls.Config) error {
	switch {
	case c == nil:
		return errors.New("TLS config required")
	case c.InsecureSkipVerify && c.VerifyConnection == nil && c.VerifyPeerCertificate == nil:
		return errors.New("TLS config skips server verification")
	}
	return nil
}

// Issue implements certs.Issuer: it sends one CreateCertificate request for
// id with a fresh key and returns the validated certificate. Errors start
// with "istioca:" and wrap the certs sentinel (ErrEmptyChain, ErrNoRoots,
// ErrIdentityMismatch, ErrExpired, ErrKeyMismatch, ErrUntrusted) or the
// gRPC status.
func (c *Client) Issue(ctx context.Context, id identity.Identity) (*certs.Cert, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("istioca: %w: zero identity", certs.ErrIdentityMismatch)
	}
	md, err := c.metadata()
	if err != nil {
		return nil, fmt.Errorf("istioca: issue %v: %w", id, err)
	}
	key, csrPEM, err := newCSR(id)
	if err != nil {
		return nil, fmt.Errorf("istioca: issue %v: %w", id, err)
	}
	req := &pb.IstioCertificateRequest{Csr: string(csrPEM), ValidityDuration: c.ttlSecs}
	if c.cfg.Impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			ImpersonatedIdentityKey: structpb.NewStringValue(id.String()),
		}}
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), c.cfg.timeout())
	defer cancel()
	resp, err := c.create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("istioca: CreateCertificate for %v: %w", id, err)
	}
	cert, err := parseResponse(id, key, resp.GetCertChain(), time.Now(), &c.cas)
	if err != nil {
		return nil, fmt.Errorf("istioca: response for %v: %w", id, err)
	}
	return cert, nil
}

// maxResends bounds how often create sends a request again on the channel
// that replaced the one it was about to use.
const maxResends = 2

// testHookAfterConnect, if non-nil, runs between create's connect and its
// call (export_test.go).
var testHookAfterConnect func(*Client)

// create sends req on the current channel. A concurrent Issue may replace a
// failed channel (channel closes the old one) after connect handed it to
// this call and before the call started: the call then fails with
// Canceled, "the client connection is closing", instead of the failure a
// fresh attempt gives. So create sends it again, on the new channel.
func (c *Client) create(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	for resends := 0; ; resends++ {
		conn, err := c.connect(ctx)
		if err != nil {
			return nil, err
		}
		if testHookAfterConnect != nil {
			testHookAfterConnect(c)
		}
		resp, err := pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, req)
		if err != nil && resends < maxResends && ctx.Err() == nil && conn.GetState() == connectivity.Shutdown {
			continue
		}
		return resp, err
	}
}

// metadata builds one request's gRPC metadata, reading the token afresh.
func (c *Client) metadata() (metadata.MD, error) {
	md := metadata.Pairs(c.headers...)
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token()
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		if tok == "" || !istiod.ValidValue(tok) {
			return nil, errors.New("token: empty or not printable ASCII")
		}
		md.Set(mdAuthorization, "Bearer "+tok)
	}
	if c.cfg.ClusterID != "" {
		md.Set(mdClusterID, c.cfg.ClusterID)
	}
	return md, nil
}
