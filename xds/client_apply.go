package xds

import (
	"errors"
	"fmt"
	"strings"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// decoded is one resource of a response, converted and ready to insert.
// Exactly one of w, s and p is set.
type decoded struct {
	name, version string
	w             *state.Workload
	s             *state.Service
	p             *rbac.Policy
}

// rejection is one resource that could not be applied.
type rejection struct {
	name   string
	reason error
}

// handleResponse applies resp to the store and returns the request that
// answers it: an ACK, or a NACK whose error_detail.message lists every
// rejected resource as "name: reason; ..." (SPEC §5.1). Valid resources
// and all removals are applied in one batch even when some are rejected.
// ack reports whether the answer is an ACK. It consumes resp.Resources (see
// decodeEach): the caller must not use them afterwards.
//
// gc is the collector relaxation the stream's codec started to unmarshal
// resp (pushCodec), or nil. handleResponse applies resp under it, or, if
// nil and resp is a large push, under one of its own (with
// Config.TunePushes), and ends it before returning, whatever the answer.
func (c *Client) handleResponse(resp *discoveryv3.DeltaDiscoveryResponse, gc *gcRelaxation) (req *discoveryv3.DeltaDiscoveryRequest, ack bool) {
	if c.cfg.TunePushes {
		gc = gc.extend(len(resp.GetResources()) + len(resp.GetRemovedResources()))
	}
	defer gc.end()
	c.metrics.received(resp)
	typeURL := resp.GetTypeUrl()
	req = &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}
	held, ok := c.held[typeURL]
	if !ok {
		// Not something we subscribed to: refuse it, change nothing.
		msg := fmt.Sprintf("unsubscribed type %q", typeURL)
		req.ErrorDetail = status.New(codes.InvalidArgument, msg).Proto()
		c.log.Warn("xds NACK", "type", typeURL, "nonce", resp.GetNonce(), "error", msg)
		return req, false
	}
	var answered []*demandWait
	if c.cfg.onDemandType(typeURL) {
		answered = c.matchDemands(resp)
	}
	var rejects []rejection
	apply := func() { rejects = c.apply(typeURL, held, resp) }
	if c.cfg.TunePushes {
		runAtPriority(len(resp.GetResources())+len(resp.GetRemovedResources()), apply)
	} else {
		apply()
	}
	// After the store has the response, as ztunnel notifies its demanders
	// only once the handlers ran (HandlerWrapper::handle).
	releaseDemands(answered)
	c.log.Debug("xds response applied", "type", typeURL, "nonce", resp.GetNonce(),
		"resources", len(resp.GetResources()), "removed", len(resp.GetRemovedResources()), "rejected", len(rejects))
	if len(rejects) == 0 {
		return req, true
	}
	msg := nackMessage(rejects)
	req.ErrorDetail = status.New(codes.InvalidArgument, msg).Proto()
	c.log.Warn("xds NACK", "type", typeURL, "nonce", resp.GetNonce(), "rejected", len(rejects), "error", msg)
	return req, false
}

// lowPriorityMin is the number of resources (and removals) from which a
// response is decoded and applied at low priority (runLowPriority): about
// 10 ms of CPU. A smaller one, a policy change most often, runs at normal
// priority on the stream's goroutine, so that a node whose CPU is
// saturated (by load or by an attacker) does not hold back an
// authorization change behind its data path.
const lowPriorityMin = 1_000

// runAtPriority runs fn, the decoding and applying of a response of n
// resources and removals: at low priority from lowPriorityMin, else on the
// calling goroutine.
func runAtPriority(n int, fn func()) {
	if n >= lowPriorityMin {
		runLowPriority(fn)
		return
	}
	fn()
}

// maxNACKMessage bounds error_detail.message, so that a push with very many
// bad resources (TESTPLAN 42) cannot produce a NACK larger than the
// server accepts.
const maxNACKMessage = 64 << 10

// nackMessage formats rejects as "name: reason; name: reason", listing as
// many as fit in maxNACKMessage and then "... and N more".
func nackMessage(rejects []rejection) string {
	var b strings.Builder
	for i, r := range rejects {
		entry := r.name + ": " + r.reason.Error()
		if b.Len()+len(entry)+2 > maxNACKMessage {
			fmt.Fprintf(&b, "; ... and %d more", len(rejects)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(entry)
	}
	return b.String()
}

// newNames counts the resources of rs whose names held has no version of,
// all of them and the workloads among them, and the bytes of their names
// and versions: the room the version table and the store's workload tables
// need (an update takes the slot it had). The counts come before decoding,
// so they include resources that will be rejected: they are hints.
func newNames(held *versionTable, typeURL string, rs []*discoveryv3.Resource) (all, workloads, size int) {
	for _, r := range rs {
		if !held.Has(r.GetName()) {
			all++
			size += len(r.GetName()) + len(r.GetVersion())
			if typeURL == AddressTypeURL && isWorkloadAddress(r.GetResource().GetValue()) {
				workloads++
			}
		}
	}
	return all, workloads, size
}

// isWorkloadAddress reports whether an Address message starts with its
// workload field (length-delimited), as an encoded workload does: the
// message holds one field of its oneof.
func isWorkloadAddress(b []byte) bool {
	return len(b) > 0 && b[0] == byte(protowire.EncodeTag(addrWorkload, protowire.BytesType))
}

// apply decodes the resources of resp and inserts them, and removes its
// removed names, in one batch (removals first, so a name both removed and
// sent ends up present), then brings held up to date. Only names in held
// are removed from the store. It returns the resources rejected by the
// decoder, then those the store refused.
//
// Each resource is decoded and inserted before the next is decoded, into
// one reused workload (the store keeps a record of its own, not the
// workload it is given): so a large push never holds its decoded workloads
// all at once, and a garbage collection during the push marks only what is
// left of the response and the store.
func (c *Client) apply(typeURL string, held *versionTable, resp *discoveryv3.DeltaDiscoveryResponse) []rejection {
	removed := resp.GetRemovedResources()
	added, addedWorkloads, addedSize := newNames(held, typeURL, resp.GetResources())
	type nameVersion struct{ name, version string }
	kept := make([]nameVersion, 0, len(resp.GetResources()))
	var rejects, refused []rejection
	c.cfg.Store.Update(func(b *state.Batch) {
		if typeURL == AddressTypeURL {
			b.Reserve(addedWorkloads)
		}
		for _, name := range removed {
			if !held.Has(name) {
				// Never received, or put there by another source (the
				// local config): not ours to remove (TESTPLAN 45).
				continue
			}
			if typeURL == AddressTypeURL {
				// SPEC §5.3: a workload uid first, then a service key.
				_ = b.RemoveWorkload(name) || b.RemoveService(name)
			} else {
				b.RemovePolicy(name)
			}
		}
		dc := newDecodeCache()
		dc.reuse = true
		rejects = decodeEach(resp, dc, func(d decoded) {
			var err error
			switch {
			case d.w != nil:
				err = b.InsertWorkload(d.w)
			case d.s != nil:
				err = b.InsertService(d.s)
			default:
				err = b.InsertPolicy(d.p)
			}
			if err != nil {
				refused = append(refused, rejection{d.name, err})
				return
			}
			kept = append(kept, nameVersion{d.name, d.version})
		})
	})
	for _, name := range removed {
		held.Delete(name)
	}
	if added > held.Len()/8 && added >= relaxGCMin {
		// Sized once for a large push, rather than grown step by step.
		held.Grow(added, addedSize)
	}
	for _, nv := range kept {
		held.Set(nv.name, nv.version)
	}
	return append(rejects, refused...)
}

// decodeEach decodes and converts every resource of resp, in order, and
// hands each valid one to yield; it returns the rejected ones. When c
// reuses its workload (decodeCache.reuse), yield's workload is valid only
// during the call. A resource is rejected if it has no payload, its
// payload's type URL is not the response's, it does not decode or convert,
// its name is not its primary key (workload uid, "namespace/hostname" for
// services, "namespace/name" for policies: SPEC §5.3), or its name repeats
// an earlier resource of the same response.
//
// It consumes resp.Resources: each entry is set to nil once decoded, so that
// the memory of a large push is released while it is being applied rather
// than after (every garbage collection during the push would otherwise mark
// the whole response again).
func decodeEach(resp *discoveryv3.DeltaDiscoveryResponse, c *decodeCache, yield func(decoded)) (rejects []rejection) {
	typeURL := resp.GetTypeUrl()
	rs := resp.GetResources()
	seen := make(map[string]struct{}, len(rs))
	for i, r := range rs {
		rs[i] = nil
		name := r.GetName()
		if _, dup := seen[name]; dup {
			rejects = append(rejects, rejection{name, errors.New("duplicate resource name in one response")})
			continue
		}
		d, err := decodeResource(typeURL, r, c)
		if err != nil {
			seen[name] = struct{}{}
			rejects = append(rejects, rejection{name, err})
			continue
		}
		// d.name is the resource's own key (equal to name): keep that
		// string, so that the response's copy is released with it.
		seen[d.name] = struct{}{}
		yield(d)
	}
	return rejects
}

// decodeResource decodes and converts one resource of type typeURL. Values
// that many resources share are taken from c. A workload is read by the
// fast decoder when it can (decode_fast.go), and otherwise, as every
// service and every invalid resource, by proto.Unmarshal and the
// converters.
func decodeResource(typeURL string, r *discoveryv3.Resource, c *decodeCache) (decoded, error) {
	d := decoded{name: r.GetName(), version: c.in.str(r.GetVersion())}
	payload := r.GetResource()
	switch {
	case payload == nil:
		return d, errors.New("no resource payload")
	case payload.GetTypeUrl() != typeURL:
		return d, fmt.Errorf("payload type %q, want %q", payload.GetTypeUrl(), typeURL)
	}
	var key string
	switch typeURL {
	case AddressTypeURL:
		if w, ok := c.workload(payload.GetValue(), d.name); ok {
			d.w = w
			return d, nil
		}
		var a workloadapi.Address
		if err := proto.Unmarshal(payload.GetValue(), &a); err != nil {
			return d, fmt.Errorf("decode: %w", err)
		}
		var err error
		if d.w, d.s, err = addressFromProto(&a, c.in); err != nil {
			return d, err
		}
		if d.w != nil {
			key = d.w.UID
		} else {
			key = d.s.Key()
		}
	case AuthorizationTypeURL:
		var a security.Authorization
		if err := proto.Unmarshal(payload.GetValue(), &a); err != nil {
			return d, fmt.Errorf("decode: %w", err)
		}
		var err error
		if d.p, err = PolicyFromProto(&a); err != nil {
			return d, err
		}
		key = d.p.Key()
	}
	if key != d.name {
		return d, fmt.Errorf("resource name is not the resource's key %q", key)
	}
	d.name = key
	return d, nil
}
