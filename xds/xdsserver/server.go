// Package xdsserver is a fake istiod for tests and benchmarks: an in-process
// delta ADS server (envoy.service.discovery.v3.AggregatedDiscoveryService,
// DeltaAggregatedResources) on real gRPC over loopback, optionally with TLS.
//
// The server keeps a resource set per type URL. A stream's first request for
// a type gets every resource of that type, except those whose version the
// client reports unchanged in initial_resource_versions, and removals for
// the names the client reports that the server no longer has (as istiod
// does). Later Push and Remove calls update the set and are sent to every
// stream subscribed to that type, each response with a fresh nonce. A
// stream that subscribes to names rather than by wildcard (on-demand, as
// ztunnel's XDS_ON_DEMAND does) is answered as istiod answers it: see
// ondemand.go. Every
// request the server receives (initial requests, ACKs, NACKs) is available
// on Requests for inspection.
//
// Faults: CloseStreams ends every stream with OK or a given gRPC status,
// Blackhole keeps TCP connections open while dropping every byte in both
// directions, and Send delivers an arbitrary response (stale nonce, wrong
// type URL, undecodable payload).
//
// Errors are returned, never reported through a testing.TB: the package
// imports no testing, so that bench (the harness behind `gozt bench`,
// cmd/gozt-bench) can run it inside its binary. Tests use xds/xdstest, a testing.TB wrapper that
// stops the server when the test ends.
//
// Typical use:
//
//	srvTLS, cliTLS, err := xdsserver.TLSConfigs()
//	...
//	s, err := xdsserver.New(srvTLS)
//	...
//	defer s.Close()
//	s.PushWorkload(&workloadapi.Workload{Uid: "c//Pod/ns/a", ...})
//	c, _ := xds.NewClient(xds.Config{Address: "https://" + s.Addr(), TLS: cliTLS, Store: st})
//
// Of this module, xdsserver imports xds only.
package xdsserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Server is a fake delta ADS server. Its methods are safe for concurrent
// use. Close stops it.
//
// Invariants:
//   - mu guards the resource set, the stream set and every stream's
//     subscriptions; a response is queued on a stream while mu is held, so
//     each stream sees pushes in the order they were made, after its
//     initial response.
//   - Only a stream's handler goroutine sends on it.
type Server struct {
	lis       *listener
	grpc      *grpc.Server
	reqs      *requestLog
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup // Serve, the request pump and the receive loops

	mu        sync.Mutex
	resources map[string]map[string]*discoveryv3.Resource // type URL → name → resource
	streams   map[*stream]struct{}
	opened    int           // streams opened so far
	metadata  []metadata.MD // incoming metadata of each stream opened
	nonce     uint64        // last nonce issued
	holding   bool          // HoldAnswers is on
	version   uint64        // last version issued
}

// New starts a server on 127.0.0.1 with a random port, serving TLS with
// tlsCfg, or plaintext if tlsCfg is nil. Close stops it and ends its
// goroutines.
func New(tlsCfg *tls.Config) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("xdsserver: listen: %w", err)
	}
	s := &Server{
		lis:       newListener(l),
		done:      make(chan struct{}),
		resources: make(map[string]map[string]*discoveryv3.Resource),
		streams:   make(map[*stream]struct{}),
	}
	s.reqs = newRequestLog(s.done)
	opts := []grpc.ServerOption{
		// Let clients ping as often as gRPC allows them to (10s), so that
		// keepalive tests work.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpc = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, (*adsService)(s))
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		_ = s.grpc.Serve(s.lis)
	}()
	go func() {
		defer s.wg.Done()
		s.reqs.pump()
	}()
	return s, nil
}

// Close stops the server: it closes the listener and every connection, and
// returns once the server's goroutines have ended. Later calls do nothing.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.grpc.Stop() // closes the listener and connections, waits for handlers
		close(s.done)
		s.wg.Wait()
	})
}

// Addr returns the server's "127.0.0.1:port".
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Connections returns the number of streams opened so far.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}

// Metadata returns the gRPC metadata (authorization, clusterid, extra
// headers) each stream opened so far arrived with, oldest first.
func (s *Server) Metadata() []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.metadata)
}

// Requests returns the channel on which every request received is
// delivered, in arrival order. Undelivered requests are queued without
// bound, so a test need not read it.
func (s *Server) Requests() <-chan *discoveryv3.DeltaDiscoveryRequest { return s.reqs.out }

// NextRequest returns the next request for which match returns true (any
// request if match is nil), discarding the others, or ctx's error if none
// arrives before ctx is done.
func (s *Server) NextRequest(ctx context.Context, match func(*discoveryv3.DeltaDiscoveryRequest) bool) (*discoveryv3.DeltaDiscoveryRequest, error) {
	for {
		select {
		case r := <-s.reqs.out:
			if match == nil || match(r) {
				return r, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Push adds or replaces resources of typeURL and sends them, in one
// response, to every stream subscribed to typeURL. A resource with an empty
// Version gets a fresh one; resources are not modified (they are cloned).
// It returns the response's nonce, which the client's ACK or NACK echoes.
func (s *Server) Push(typeURL string, resources ...*discoveryv3.Resource) (nonce string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.resources[typeURL]
	if set == nil {
		set = make(map[string]*discoveryv3.Resource)
		s.resources[typeURL] = set
	}
	out := make([]*discoveryv3.Resource, len(resources))
	for i, r := range resources {
		r = proto.Clone(r).(*discoveryv3.Resource)
		if r.Version == "" {
			s.version++
			r.Version = fmt.Sprintf("v%d", s.version)
		}
		set[r.GetName()] = r
		out[i] = r
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Resources: out}
	return s.broadcastLocked(typeURL, resp, func(st *stream) *deltaResponse {
		return s.onDemandPushLocked(st, typeURL, out, resp.Nonce)
	})
}

// Remove deletes the named resources of typeURL (names the server does not
// hold are still announced) and sends the removal to every stream
// subscribed to typeURL. It returns the response's nonce.
func (s *Server) Remove(typeURL string, names ...string) (nonce string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.resources[typeURL], n)
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, RemovedResources: slices.Clone(names)}
	return s.broadcastLocked(typeURL, resp, func(st *stream) *deltaResponse {
		var subscribed []string
		for _, n := range names {
			if _, ok := st.onDemand[typeURL].names[n]; ok {
				subscribed = append(subscribed, n)
			}
		}
		if len(subscribed) == 0 {
			return nil
		}
		return &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: resp.Nonce, RemovedResources: subscribed}
	})
}

// Send delivers resp as it is to every open stream, subscribed or not,
// without changing the resource set. An empty nonce is replaced by a fresh
// one; a set nonce is kept (to replay a stale one).
func (s *Server) Send(resp *discoveryv3.DeltaDiscoveryResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp = proto.Clone(resp).(*discoveryv3.DeltaDiscoveryResponse)
	if resp.Nonce == "" {
		resp.Nonce = s.nextNonceLocked()
	}
	for st := range s.streams {
		st.events.push(event{resp: resp})
	}
}

// Resources returns name → version of the resources of typeURL the server
// holds.
func (s *Server) Resources(typeURL string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.resources[typeURL]))
	for n, r := range s.resources[typeURL] {
		out[n] = r.GetVersion()
	}
	return out
}

// CloseStreams ends every open stream: with status OK if err is nil, or
// with err (make it with google.golang.org/grpc/status). The connections
// stay open; clients are expected to open new streams.
func (s *Server) CloseStreams(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.streams {
		st.events.push(event{close: true, err: err})
	}
}

// HoldAnswers, when on, keeps back the answers to requests (initial and
// on-demand ones) while the streams stay healthy and pushes still flow, as
// an istiod that is slow to answer; turning it off sends what was kept, in
// order.
func (s *Server) HoldAnswers(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holding = on
	if on {
		return
	}
	for st := range s.streams {
		for _, r := range st.held {
			st.events.push(event{resp: r})
		}
		st.held = nil
	}
}

// Blackhole, when on, makes every connection, open or new, drop all bytes
// in both directions while staying open: no responses, no PING acks, no TLS
// handshakes. Turning it off closes the connections that dropped bytes
// (their TLS and HTTP/2 state is lost) and lets new ones work again.
func (s *Server) Blackhole(on bool) { s.lis.setBlackhole(on) }

// broadcastLocked queues resp, with a fresh nonce, on every stream
// subscribed to typeURL by wildcard, and what named(st) returns (with the
// same nonce; nothing if nil) on every stream subscribed to it by name. It
// returns the nonce.
func (s *Server) broadcastLocked(typeURL string, resp *discoveryv3.DeltaDiscoveryResponse, named func(st *stream) *deltaResponse) string {
	resp.Nonce = s.nextNonceLocked()
	for st := range s.streams {
		switch {
		case !st.subscribed[typeURL]:
		case st.onDemand[typeURL] == nil:
			st.events.push(event{resp: resp})
		default:
			if r := named(st); r != nil {
				st.events.push(event{resp: r})
			}
		}
	}
	return resp.Nonce
}

func (s *Server) nextNonceLocked() string {
	s.nonce++
	return fmt.Sprintf("nonce-%d", s.nonce)
}

// initialResponseLocked is the answer to a stream's first request for
// typeURL: every resource the client does not already hold at the current
// version, and removals for the names it holds that the server does not.
func (s *Server) initialResponseLocked(req *discoveryv3.DeltaDiscoveryRequest) *discoveryv3.DeltaDiscoveryResponse {
	typeURL := req.GetTypeUrl()
	set := s.resources[typeURL]
	held := req.GetInitialResourceVersions()
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: s.nextNonceLocked()}
	for _, name := range sortedKeys(set) {
		r := set[name]
		if v, ok := held[name]; ok && v != "" && v == r.GetVersion() {
			continue
		}
		resp.Resources = append(resp.Resources, r)
	}
	for _, name := range sortedKeys(held) {
		if _, ok := set[name]; !ok {
			resp.RemovedResources = append(resp.RemovedResources, name)
		}
	}
	return resp
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
