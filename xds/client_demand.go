package xds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// This file is the on-demand half of the client (XDS_ON_DEMAND, SPEC §5.3),
// after ztunnel's Demander and AdsClient::handle_demand_event
// (src/xds/client.rs): a lookup that misses asks istiod for one Address
// name and waits until a response mentions it.

// ErrOnDemandOff is Demand's error when the client was built without
// Config.OnDemand.
var ErrOnDemandOff = errors.New("xds: on-demand xDS is off")

// ErrDemandTimeout is Demand's error when istiod did not answer within
// Config.DemandTimeout.
var ErrDemandTimeout = errors.New("xds: no answer to an on-demand request")

// demands is the client's on-demand state; mu guards every field.
//
// Invariants:
//   - subscribed holds every name ever demanded and not since reported
//     removed: the names re-subscribed on reconnect, at version "" in the
//     initial Address request's initial_resource_versions (ztunnel's
//     add_pending_resource and known_resources).
//   - onStream holds the names istiod counts as subscribed on the current
//     stream; istiod keeps a name subscribed after answering it, found or
//     not (generateDeltasOndemand merges, never drops, w.ResourceNames), and
//     pushes its later changes, and it ignores a second subscription to it
//     (shouldRespondDelta: no change, no response). Nil without a stream.
//   - pending has one wait per name whose answer is awaited; every waiter
//     of a name shares it, and one request was sent for it (or it waits for
//     the current stream's first Address response, initial set).
//   - send is the current stream's sender once its initial requests are
//     out, else nil.
//   - forget holds the names istiod answered or later reported removed,
//     taken out of subscribed and onStream, that the current stream has
//     yet to unsubscribe (takeUnsubscribes): a name nothing holds is not
//     kept subscribed on either side, so that demands for addresses that
//     do not exist (a flood of random IPs) leave no state behind.
type demands struct {
	mu          sync.Mutex
	subscribed  map[string]struct{}
	onStream    map[string]struct{}
	pending     map[string]*demandWait
	forget      map[string]struct{}
	send        func(*discoveryv3.DeltaDiscoveryRequest) error
	initialDone bool // the current stream's first Address response was handled
}

// demandWait is one pending name; done is closed once a response mentions
// it.
type demandWait struct {
	done chan struct{}
	// initial: the answer is the current stream's first Address response
	// (the name was re-subscribed by the initial request), not a response
	// to a request of its own.
	initial bool
	waiters int // callers sharing it so far, for tests
}

func (d *demands) init() {
	d.subscribed = make(map[string]struct{})
	d.pending = make(map[string]*demandWait)
	d.forget = make(map[string]struct{})
}

// startDemandStream records that a stream starts with req, its initial
// Address request, and adds the demanded names to it; demands go out on
// send from now on (the caller holds sendMu until the initial requests are
// sent).
func (c *Client) startDemandStream(req *discoveryv3.DeltaDiscoveryRequest, send func(*discoveryv3.DeltaDiscoveryRequest) error) {
	d := &c.demands
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onStream = make(map[string]struct{}, len(d.subscribed))
	for name := range d.subscribed {
		d.onStream[name] = struct{}{}
		if _, held := req.InitialResourceVersions[name]; held {
			continue
		}
		if req.InitialResourceVersions == nil {
			req.InitialResourceVersions = make(map[string]string)
		}
		req.InitialResourceVersions[name] = ""
	}
	for _, w := range d.pending {
		w.initial = true
	}
	d.send, d.initialDone = send, false
}

// endDemandStream records that the stream ended: demands wait for the next
// one, which re-subscribes them.
func (c *Client) endDemandStream() {
	d := &c.demands
	d.mu.Lock()
	defer d.mu.Unlock()
	d.send, d.onStream = nil, nil
	clear(d.forget) // the next stream never subscribes them
}

// Demand asks istiod for the Address resource key — "network/IP" (network
// may be empty), a workload uid or "namespace/hostname", as ztunnel's
// fetch_address, fetch_workload_by_uid and fetch_hostname name them — and
// waits until a response mentions key: as a resource's name, as one of its
// aliases (istiod's appendAddress sets them to the resource's "network/IP"
// addresses), or as a removed name (istiod answers a name it does not know
// with a removal: AddressInformation in
// pilot/pkg/serviceregistry/ambient/ambientindex.go). The response has been
// applied to the store when Demand returns nil; the caller looks up again.
//
// Concurrent demands for one key share one request. A key istiod already
// answered on the current stream is not asked again: istiod ignores such a
// request, and pushes the key's changes by itself; Demand returns nil at
// once.
//
// Differences from ztunnel, whose demand waits without bound and sends one
// request per caller: the wait ends after Config.DemandTimeout
// (ErrDemandTimeout) or when ctx is done, so that a silent istiod never
// holds a connection forever; and an alias counts, since ztunnel, matching
// resource names only, would not see the answer to a "network/IP" demand
// that istiod names by uid.
func (c *Client) Demand(ctx context.Context, key string) error {
	if !c.cfg.OnDemand {
		return ErrOnDemandOff
	}
	w, send := c.registerDemand(key)
	if w == nil {
		return nil
	}
	t := time.NewTimer(c.cfg.demandTimeout())
	defer t.Stop()
	if send != nil {
		c.log.Debug("xds on-demand request", "name", key)
		// Sent on a goroutine of its own, so that a send held up (by the
		// stream's flow control, or by sendMu while a push is answered)
		// counts toward the timeout rather than before it. A failure
		// means the stream ended: the next one re-subscribes key
		// (startDemandStream).
		go func() {
			_ = send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: AddressTypeURL, ResourceNamesSubscribe: []string{key}})
		}()
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%w for %q within %v", ErrDemandTimeout, key, c.cfg.demandTimeout())
	}
}

// registerDemand returns the wait for key, and the sender to send its
// request with when this call is the one to send it; a nil wait means
// there is nothing to wait for.
func (c *Client) registerDemand(key string) (*demandWait, func(*discoveryv3.DeltaDiscoveryRequest) error) {
	d := &c.demands
	d.mu.Lock()
	defer d.mu.Unlock()
	if w, ok := d.pending[key]; ok {
		w.waiters++
		return w, nil
	}
	if _, ok := d.onStream[key]; ok {
		if d.initialDone {
			return nil, nil
		}
		// Re-subscribed by this stream's initial request: its answer
		// is on the way.
		w := &demandWait{done: make(chan struct{}), initial: true, waiters: 1}
		d.pending[key] = w
		return w, nil
	}
	w := &demandWait{done: make(chan struct{}), initial: d.send == nil, waiters: 1}
	d.pending[key] = w
	d.subscribed[key] = struct{}{}
	if d.send == nil {
		return w, nil // the next stream subscribes it
	}
	d.onStream[key] = struct{}{}
	return w, d.send
}

// matchDemands takes from pending the waits that resp, an Address
// response, answers, for the caller to release once resp is applied. It
// must run before decodeEach consumes resp.Resources. A removed name
// is no longer re-subscribed on reconnect (ztunnel drops it from
// known_resources), and one the stream subscribed is to be unsubscribed
// (takeUnsubscribes): istiod answers a name it does not know with a
// removal and would otherwise keep it in the stream's watched names for
// the stream's life (deltaWatchedResources only adds), as the client's
// sets would.
func (c *Client) matchDemands(resp *discoveryv3.DeltaDiscoveryResponse) []*demandWait {
	d := &c.demands
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*demandWait
	take := func(name string) {
		if w, ok := d.pending[name]; ok {
			delete(d.pending, name)
			out = append(out, w)
		}
	}
	for _, name := range resp.GetRemovedResources() {
		delete(d.subscribed, name)
		if _, ok := d.onStream[name]; ok {
			delete(d.onStream, name)
			d.forget[name] = struct{}{}
		}
		take(name)
	}
	if len(d.pending) > 0 {
		for _, r := range resp.GetResources() {
			take(r.GetName())
			for _, a := range r.GetAliases() {
				take(a)
			}
		}
	}
	if !d.initialDone && d.onStream != nil {
		// The answer to the initial request: istiod answers each name
		// it subscribed (found, removed, or held at its version).
		d.initialDone = true
		for name, w := range d.pending {
			if w.initial {
				delete(d.pending, name)
				out = append(out, w)
			}
		}
	}
	return out
}

// sendUnsubscribes sends, on the current stream, one request
// unsubscribing the names matchDemands set to forget, unless nothing is to
// be forgotten. It runs after the response's ACK went out: istiod takes a
// subscription change carried by an ACK for an error. sendMu is held from
// taking the names to sending them, so a demand for one of them made
// meanwhile either keeps it off the list (it is back on the stream) or
// sends its subscription after this request.
func (c *Client) sendUnsubscribes(send func(*discoveryv3.DeltaDiscoveryRequest) error) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	names := c.takeUnsubscribes()
	if len(names) == 0 {
		return nil
	}
	return send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: AddressTypeURL, ResourceNamesUnsubscribe: names})
}

// takeUnsubscribes empties the names to forget and returns, sorted, those
// not subscribed again since.
func (c *Client) takeUnsubscribes() []string {
	d := &c.demands
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.forget) == 0 {
		return nil
	}
	names := make([]string, 0, len(d.forget))
	for name := range d.forget {
		if _, back := d.onStream[name]; !back {
			names = append(names, name)
		}
	}
	clear(d.forget)
	slices.Sort(names)
	return names
}

// releaseDemands wakes the waiters of ws.
func releaseDemands(ws []*demandWait) {
	for _, w := range ws {
		close(w.done)
	}
}
