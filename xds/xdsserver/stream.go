package xdsserver

import (
	"context"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

var errUnimplemented = status.Error(codes.Unimplemented, "xdsserver: only DeltaAggregatedResources is served")

type (
	deltaRequest  = discoveryv3.DeltaDiscoveryRequest
	deltaResponse = discoveryv3.DeltaDiscoveryResponse
	deltaStream   = grpc.BidiStreamingServer[deltaRequest, deltaResponse]
)

// adsService is the gRPC face of Server.
type adsService Server

var _ discoveryv3.AggregatedDiscoveryServiceServer = (*adsService)(nil)

// StreamAggregatedResources is not supported: ztunnel speaks delta xDS only.
func (a *adsService) StreamAggregatedResources(grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	return errUnimplemented
}

// DeltaAggregatedResources serves one stream: it is the stream's only
// sender and handles its events in order.
func (a *adsService) DeltaAggregatedResources(ds deltaStream) error {
	s := (*Server)(a)
	st := &stream{subscribed: make(map[string]bool), onDemand: make(map[string]*onDemand), events: newQueue[event]()}
	md, _ := metadata.FromIncomingContext(ds.Context())
	s.mu.Lock()
	s.opened++
	s.metadata = append(s.metadata, md.Copy())
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, st)
		s.mu.Unlock()
	}()

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.receive(ds, st)
	}()
	ctx := ds.Context()
	for {
		ev, ok := st.events.pop(ctx)
		if !ok {
			return ctx.Err()
		}
		switch {
		case ev.close:
			return ev.err
		case ev.recvDone:
			return nil
		case ev.req != nil:
			if resp := s.answer(st, ev.req); resp != nil {
				if err := ds.Send(resp); err != nil {
					return err
				}
			}
		case ev.resp != nil:
			if err := ds.Send(ev.resp); err != nil {
				return err
			}
		}
	}
}

// receive logs every request of ds and hands it to the handler, until ds
// ends.
func (s *Server) receive(ds deltaStream, st *stream) {
	for {
		req, err := ds.Recv()
		if err != nil {
			st.events.push(event{recvDone: true})
			return
		}
		s.reqs.add(req)
		st.events.push(event{req: req})
	}
}

// answer returns the initial response if req is the stream's first request
// for its type, the answer to a later request that changes a named
// subscription (ondemand.go), and nil for ACKs, NACKs and other requests.
func (s *Server) answer(st *stream, req *deltaRequest) *deltaResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.node == "" {
		st.node = nodeName(req)
	}
	if req.GetResponseNonce() != "" {
		return nil
	}
	resp := s.answerLocked(st, req)
	if resp != nil && s.holding {
		st.held = append(st.held, resp)
		return nil
	}
	return resp
}

// answerLocked is answer for a request with no nonce.
func (s *Server) answerLocked(st *stream, req *deltaRequest) *deltaResponse {
	typeURL := req.GetTypeUrl()
	if !st.subscribed[typeURL] {
		st.subscribed[typeURL] = true
		if isWildcard(req) {
			return s.initialResponseLocked(req)
		}
		st.onDemand[typeURL] = &onDemand{names: requested(req)}
		return s.onDemandAnswerLocked(st, typeURL, requested(req), req.GetInitialResourceVersions())
	}
	sub := st.onDemand[typeURL]
	if sub == nil || !sub.subscribe(req) {
		return nil
	}
	return s.onDemandAnswerLocked(st, typeURL, requested(req), nil)
}

// stream is one open DeltaAggregatedResources call. Its fields are guarded
// by Server.mu.
type stream struct {
	subscribed map[string]bool // type URLs requested
	// onDemand holds the named (non-wildcard) subscriptions, by type URL.
	onDemand map[string]*onDemand
	node     string           // NODE_NAME of the client's Node, once a request carried it
	held     []*deltaResponse // answers kept back by HoldAnswers
	events   *queue[event]
}

// event is something for a stream's handler to do; exactly one field set
// (err goes with close).
type event struct {
	req      *deltaRequest  // a request received
	resp     *deltaResponse // a response to send
	close    bool           // end the stream with err
	err      error
	recvDone bool // the client's side ended
}

// queue is an unbounded FIFO whose pop waits. Pushing never blocks, so the
// server never waits on a slow or blackholed client while holding its lock.
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	signal chan struct{} // holds a token when items may be non-empty
}

func newQueue[T any]() *queue[T] { return &queue[T]{signal: make(chan struct{}, 1)} }

func (q *queue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// pop returns the oldest item, waiting for one until ctx is done.
func (q *queue[T]) pop(ctx context.Context) (T, bool) {
	return q.popOr(ctx.Done())
}

// popOr returns the oldest item, waiting for one until done is closed.
func (q *queue[T]) popOr(done <-chan struct{}) (T, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			q.mu.Unlock()
			return v, true
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-done:
			var zero T
			return zero, false
		}
	}
}

// requestLog queues every request received and feeds them to out.
type requestLog struct {
	q    *queue[*deltaRequest]
	out  chan *deltaRequest
	done <-chan struct{}
}

func newRequestLog(done <-chan struct{}) *requestLog {
	return &requestLog{q: newQueue[*deltaRequest](), out: make(chan *deltaRequest), done: done}
}

func (l *requestLog) add(r *deltaRequest) { l.q.push(r) }

// pump delivers queued requests to out until done is closed.
func (l *requestLog) pump() {
	for {
		r, ok := l.q.popOr(l.done)
		if !ok {
			return
		}
		select {
		case l.out <- r:
		case <-l.done:
			return
		}
	}
}
