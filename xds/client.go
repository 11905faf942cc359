package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gozt/gozt/istiod"
	"github.com/gozt/gozt/state"
)

// Type URLs of the two resource types ztunnel subscribes to (SPEC §5.1).
const (
	AddressTypeURL       = "type.googleapis.com/istio.workload.Address"
	AuthorizationTypeURL = "type.googleapis.com/istio.security.Authorization"
)

// Transport settings of SPEC §5.1.
const (
	maxRecvMsgSize          = 200 << 20 // 200 MiB
	defaultKeepaliveTime    = 30 * time.Second
	defaultKeepaliveTimeout = 10 * time.Second
	defaultConnectTimeout   = 5 * time.Second
	tcpKeepaliveIdle        = 300 * time.Second
	tcpKeepaliveInterval    = 75 * time.Second
	tcpKeepaliveCount       = 9
)

// subscribedTypes are the wildcard subscriptions, in the order of the
// initial requests.
var subscribedTypes = [...]string{AddressTypeURL, AuthorizationTypeURL}

// Config configures a Client.
type Config struct {
	// Address is the xDS server, "https://host:port" (XDS_ADDRESS). The
	// scheme must be https; a missing port means 443. Required.
	Address string
	// TLS verifies the server (roots, server name, ALT_XDS_HOSTNAME); the
	// caller builds it. Required.
	TLS *tls.Config
	// Token returns the bearer token, and is called before every stream so
	// that a token file is re-read each time. When non-nil, every stream
	// carries "authorization: Bearer <token>" and "clusterid: <ClusterID>".
	// Or nil: no authentication metadata.
	Token func() (string, error)
	// ClusterID is sent as "clusterid" metadata along with the token.
	ClusterID string
	// Headers is extra gRPC metadata for every stream (XDS_HEADER_*). Or nil.
	Headers map[string]string
	// Node is sent on each initial request; see BuildNode. If nil, an empty
	// Node is sent.
	Node *corev3.Node
	// Store receives the resources. Required.
	Store *state.Store
	// Logger, or nil to log nothing.
	Logger *slog.Logger
	// Metrics registers the SPEC §7.2 xDS counters, or nil for none.
	Metrics prometheus.Registerer
	// Backoff is the reconnect policy; the zero value is SPEC §5.1's.
	Backoff Backoff
	// Dialer opens the TCP connection to addr ("host:port"). If nil, a
	// net.Dialer with TCP keepalive 300s/75s×9 is used.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
	// KeepaliveTime is the HTTP/2 PING interval on an idle connection. If
	// zero, 30s is used. gRPC enforces a minimum of 10s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long a PING may go unanswered before the
	// connection is closed. If zero, 10s is used.
	KeepaliveTimeout time.Duration
	// ConnectTimeout bounds dialing and the TLS handshake. If zero, 5s is
	// used.
	ConnectTimeout time.Duration
	// OnDemand subscribes to Address resources on demand (XDS_ON_DEMAND,
	// SPEC §5.3): the initial Address request subscribes to nothing, and
	// Demand fetches one name at a time. Authorization stays a wildcard
	// subscription.
	OnDemand bool
	// DemandTimeout bounds how long Demand waits for istiod to answer. If
	// zero, ConnectTimeout (or its 5s default) is used.
	DemandTimeout time.Duration
	// TunePushes lets the client change process-wide settings while it
	// receives and applies a large push: the collector's GOGC and memory
	// limit (gcpace.go) and the CPU priority of the thread doing the work
	// (priority_linux.go). Only the program that owns the process should
	// set it (gozt proxy does, and gozt bench's gozt as it); left false,
	// the client changes nothing outside itself.
	TunePushes bool
}

func (c *Config) keepaliveTime() time.Duration {
	if c.KeepaliveTime <= 0 {
		return defaultKeepaliveTime
	}
	return c.KeepaliveTime
}

func (c *Config) keepaliveTimeout() time.Duration {
	if c.KeepaliveTimeout <= 0 {
		return defaultKeepaliveTimeout
	}
	return c.KeepaliveTimeout
}

func (c *Config) connectTimeout() time.Duration {
	if c.ConnectTimeout <= 0 {
		return defaultConnectTimeout
	}
	return c.ConnectTimeout
}

// onDemandType reports whether type t is asked for by name rather than
// by wildcard: Address resources, with OnDemand (SPEC §5.3).
func (c *Config) onDemandType(t string) bool { return c.OnDemand && t == AddressTypeURL }

func (c *Config) demandTimeout() time.Duration {
	if c.DemandTimeout <= 0 {
		return c.connectTimeout()
	}
	return c.DemandTimeout
}

// Client is a delta ADS client (SPEC §5.1) that keeps a state.Store in step
// with istiod.
//
// Invariants:
//   - Run owns the stream: one goroutine receives, applies and answers
//     responses in order, so held needs no lock.
//   - held lists, per type URL, the version of every resource currently in
//     the store from xDS. A rejected update leaves the previous version (if
//     any) there, since that is what the store still holds; a resource that
//     was never accepted is never listed, so its rejected version is not
//     echoed on reconnect. Keeping the old version listed lets istiod send
//     its removal if it disappears while we are disconnected.
//   - Removals touch only names in held: what another source (the local
//     config) put in the store is never removed by xDS.
//   - Every response is applied in one state.Batch, after decoding and
//     converting off the store lock.
type Client struct {
	cfg     Config
	log     *slog.Logger
	metrics *clientMetrics
	target  string // gRPC target, passthrough:///host:port
	running atomic.Bool

	mu    sync.Mutex
	acked map[string]bool // type URLs whose first ACK was sent; guarded by mu
	ready chan struct{}   // closed when acked holds every wildcard type
	// wildcard lists the types subscribed by wildcard, the ones readiness
	// waits for: both, or only Authorization with OnDemand.
	wildcard []string
	// status is the stream's state for Status; guarded by mu.
	status Status

	held map[string]*versionTable // type URL → name → version; Run only

	// sendMu serializes Send on the current stream: Run sends ACKs and
	// Demand sends subscriptions (gRPC allows one sender at a time).
	sendMu  sync.Mutex
	demands demands // on-demand subscriptions (client_demand.go)
}

// NewClient checks cfg and returns a client; it does not connect.
func NewClient(cfg Config) (*Client, error) {
	hostport, err := istiod.HostPort(cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	if cfg.TLS == nil {
		return nil, errors.New("xds: NewClient: TLS config is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("xds: NewClient: Store is required")
	}
	if _, err := istiod.Headers(cfg.Headers); err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	m, err := newClientMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		cfg:     cfg,
		log:     log,
		metrics: m,
		target:  "passthrough:///" + hostport,
		acked:   make(map[string]bool),
		ready:   make(chan struct{}),
		held:    make(map[string]*versionTable),
	}
	for _, t := range subscribedTypes {
		c.held[t] = newVersionTable()
		if !cfg.onDemandType(t) {
			c.wildcard = append(c.wildcard, t)
		}
	}
	c.demands.init()
	return c, nil
}

// Ready returns a channel that is closed once the first response of each
// wildcard-subscribed type has been applied and ACKed (SPEC §5.1): with
// OnDemand, Address is not waited for, as ztunnel's types_to_expect leaves
// out on-demand types. A response with a rejected resource (NACK) does not
// count.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Status is the state of the client's stream to istiod, for the admin live
// view.
type Status struct {
	// Connected reports whether a stream is established now.
	Connected bool
	// Since is when Connected last changed (the first attempt's outcome
	// counts as a change); zero before the first attempt ended or connected.
	Since time.Time
	// LastError is how the last stream failed, or "" if none has yet.
	LastError string
}

// Status returns the state of the stream to istiod now.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// setStatus records that a stream was established (connected) or ended
// with err.
func (c *Client) setStatus(connected bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status.Since.IsZero() || c.status.Connected != connected {
		c.status.Connected, c.status.Since = connected, time.Now()
	}
	if err != nil {
		c.status.LastError = err.Error()
	}
}

// markAcked records that a response of typeURL was ACKed.
func (c *Client) markAcked(typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.acked[typeURL] {
		return
	}
	c.acked[typeURL] = true
	for _, t := range c.wildcard {
		if !c.acked[t] {
			return
		}
	}
	close(c.ready)
}

// Run connects to the server and keeps the store in step with it,
// reconnecting after every failure (SPEC §5.1), until ctx is done. It
// returns nil once ctx is done and every goroutine it started has ended,
// or an error at once if Run is already running.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xds: Client.Run called while already running")
	}
	defer c.running.Store(false)
	bo := newBackoffState(c.cfg.Backoff, nil)
	for attempt := 1; ; attempt++ {
		res := c.runStream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.setStatus(false, res.err)
		c.metrics.terminated(res.reason)
		var delay time.Duration
		if res.benign() {
			delay = bo.benign()
			c.log.Debug("xds stream ended, reconnecting", "attempt", attempt, "reason", string(res.reason), "err", res.err, "delay", delay)
		} else {
			delay = bo.failure()
			c.log.Warn("xds stream failed, reconnecting", "attempt", attempt, "reason", string(res.reason), "err", res.err, "delay", delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// streamResult is how one stream ended.
type streamResult struct {
	reason terminationReason
	err    error // nil for a clean end
}

// benign reports whether the next attempt should follow without backoff.
func (r streamResult) benign() bool {
	return r.reason == reasonComplete || r.reason == reasonReconnect
}

// runStream opens one connection and one stream, and serves it until it
// ends. It returns only after the connection is closed.
func (c *Client) runStream(ctx context.Context) streamResult {
	md, err := c.streamMetadata()
	if err != nil {
		return streamResult{reasonConnectionError, err}
	}
	conn, err := grpc.NewClient(c.target, c.dialOptions()...)
	if err != nil {
		return streamResult{reasonConnectionError, err}
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	defer cancel()
	codec := newPushCodec(c.cfg.TunePushes)
	defer codec.drop()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx, grpc.ForceCodecV2(codec))
	if err != nil {
		return streamResult{reasonConnectionError, err}
	}
	sendLocked := func(req *discoveryv3.DeltaDiscoveryRequest) error { return stream.Send(req) }
	send := func(req *discoveryv3.DeltaDiscoveryRequest) error {
		c.sendMu.Lock()
		defer c.sendMu.Unlock()
		return sendLocked(req)
	}
	// The initial requests go out before any demand can use the stream:
	// Demand takes sendMu too, and finds the stream published only once
	// sendMu is held here.
	c.sendMu.Lock()
	var sendErr error
	for _, req := range c.initialRequests(send) {
		if sendErr = stream.Send(req); sendErr != nil {
			break
		}
	}
	c.sendMu.Unlock()
	defer c.endDemandStream()
	if sendErr != nil {
		return classifyStreamEnd(streamError(stream, sendErr))
	}
	c.log.Info("xds stream established", "address", c.cfg.Address)
	c.setStatus(true, nil)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return classifyStreamEnd(err)
		}
		// A large response was unmarshalled with the collector relaxed:
		// handleResponse applies it under the same relaxation, and ends it.
		req, ack := c.handleResponse(resp, codec.take(resp))
		if err := send(req); err != nil {
			return classifyStreamEnd(streamError(stream, err))
		}
		if err := c.sendUnsubscribes(sendLocked); err != nil {
			return classifyStreamEnd(streamError(stream, err))
		}
		if ack {
			c.markAcked(resp.GetTypeUrl())
		}
	}
}

// streamError returns the status that ended the stream after Send failed:
// gRPC reports io.EOF from Send and the real status from Recv.
func streamError(stream grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
}

// classifyStreamEnd maps how a stream ended to a termination reason (SPEC
// §5.1, §7.2): a clean end is Complete; Unknown, Canceled,
// DeadlineExceeded, and Unavailable caused by the server closing or going
// away are benign (Reconnect); everything else is an Error.
func classifyStreamEnd(err error) streamResult {
	if err == nil || errors.Is(err, io.EOF) {
		return streamResult{reasonComplete, nil}
	}
	st, ok := status.FromError(err)
	if !ok {
		return streamResult{reasonError, err}
	}
	switch st.Code() {
	case codes.Unknown, codes.Canceled, codes.DeadlineExceeded:
		return streamResult{reasonReconnect, err}
	case codes.Unavailable:
		if msg := st.Message(); strings.Contains(msg, "transport is closing") ||
			strings.Contains(msg, "received prior goaway") {
			return streamResult{reasonReconnect, err}
		}
	}
	return streamResult{reasonError, err}
}

// streamMetadata returns the metadata of the next stream, reading the token
// afresh.
func (c *Client) streamMetadata() (metadata.MD, error) {
	md := metadata.MD{}
	for k, v := range c.cfg.Headers {
		md.Set(k, v)
	}
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token()
		if err != nil {
			return nil, fmt.Errorf("xds: token: %w", err)
		}
		md.Set("authorization", "Bearer "+tok)
		if c.cfg.ClusterID != "" {
			md.Set("clusterid", c.cfg.ClusterID)
		}
	}
	return md, nil
}

func (c *Client) dialOptions() []grpc.DialOption {
	dial := c.cfg.Dialer
	if dial == nil {
		d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     tcpKeepaliveIdle,
			Interval: tcpKeepaliveInterval,
			Count:    tcpKeepaliveCount,
		}}
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(c.cfg.TLS)),
		grpc.WithContextDialer(dial),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    c.cfg.keepaliveTime(),
			Timeout: c.cfg.keepaliveTimeout(),
			// istiod's enforcement policy sends GOAWAY to clients that
			// ping without a stream; we always have one.
			PermitWithoutStream: false,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.DefaultConfig,
			MinConnectTimeout: c.cfg.connectTimeout(),
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
		grpc.WithDisableServiceConfig(),
	}
}

// initialRequests returns the first request of each subscribed type: the
// Node and the versions of the resources held; wildcard (no names), or,
// for Address with OnDemand, subscribe and unsubscribe "*" in one request
// ("subscribe to nothing", ztunnel's construct_initial_request), with the
// names demanded so far listed at version "" (ztunnel's
// add_pending_resource), which istiod's deltaWatchedResources
// (pilot/pkg/xds/delta.go) counts as subscribed. It publishes send as the
// stream demands go out on (startDemandStream).
func (c *Client) initialRequests(send func(*discoveryv3.DeltaDiscoveryRequest) error) []*discoveryv3.DeltaDiscoveryRequest {
	node := c.cfg.Node
	if node == nil {
		node = &corev3.Node{}
	}
	reqs := make([]*discoveryv3.DeltaDiscoveryRequest, 0, len(subscribedTypes))
	for _, t := range subscribedTypes {
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, Node: node}
		if held := c.held[t]; held.Len() > 0 {
			req.InitialResourceVersions = make(map[string]string, held.Len())
			for name, v := range held.All() {
				req.InitialResourceVersions[name] = v
			}
		}
		if c.cfg.onDemandType(t) {
			req.ResourceNamesSubscribe = []string{"*"}
			req.ResourceNamesUnsubscribe = []string{"*"}
			c.startDemandStream(req, send)
		}
		reqs = append(reqs, req)
	}
	return reqs
}
