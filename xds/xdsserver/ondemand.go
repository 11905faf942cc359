package xdsserver

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/xds"
)

// This file answers named (on-demand) subscriptions as istiod does
// (pilot/pkg/xds/delta.go shouldRespondDelta and deltaWatchedResources,
// pilot/pkg/xds/workload.go WorkloadGenerator.generateDeltasOndemand,
// pilot/pkg/serviceregistry/ambient/ambientindex.go index.Lookup,
// AddressInformation and AdditionalPodSubscriptions, and
// pilot/pkg/model/service.go AddressInfo.Aliases):
//
//   - A first request for a type that subscribes to names (a client asking
//     for nothing subscribes and unsubscribes "*" at once) is not
//     wildcard: the stream is subscribed to subscribe ∪
//     initial_resource_versions − unsubscribe, and gets an answer for each
//     of those names, even an empty one.
//   - A later request with no nonce that changes the names gets an answer
//     for the names it lists; one that changes nothing gets none.
//   - An answer looks each name up as a workload uid, then "network/IP" of
//     workloads, then a service ("namespace/hostname" or "network/IP" of a
//     VIP, with the workloads that are its endpoints). Found resources carry
//     their "network/IP" addresses as aliases; a name found nowhere is
//     listed in removed_resources. Workloads on the client's node
//     (NODE_NAME) are always added. Every resource sent is subscribed from
//     then on, and a name stays subscribed once answered, found or not.
//   - Later pushes reach such a stream only for subscribed names (by name
//     or alias), workloads of its node and endpoints of subscribed
//     services; removals only for subscribed names.

// onDemand is a stream's named subscription to one type.
type onDemand struct {
	names map[string]struct{}
}

// subscribe applies a request's names, as deltaWatchedResources does, and
// reports whether the set changed.
func (o *onDemand) subscribe(req *deltaRequest) (changed bool) {
	for _, n := range req.GetResourceNamesSubscribe() {
		if _, ok := o.names[n]; !ok {
			o.names[n] = struct{}{}
			changed = true
		}
	}
	for n := range req.GetInitialResourceVersions() {
		if _, ok := o.names[n]; !ok {
			o.names[n] = struct{}{}
			changed = true
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if _, ok := o.names[n]; ok {
			delete(o.names, n)
			changed = true
		}
	}
	delete(o.names, "*")
	return changed
}

// requested is the names a request asks for (istiod's
// PushRequest.Delta.Subscribed): subscribe ∪ initial_resource_versions −
// unsubscribe, without "*".
func requested(req *deltaRequest) map[string]struct{} {
	o := onDemand{names: make(map[string]struct{})}
	o.subscribe(req)
	return o.names
}

// isWildcard reports whether a stream's first request for a type is a
// wildcard subscription, as deltaWatchedResources decides: it subscribes
// to nothing, or "*" stays subscribed.
func isWildcard(req *deltaRequest) bool {
	if len(req.GetResourceNamesSubscribe()) == 0 {
		return true
	}
	return slices.Contains(req.GetResourceNamesSubscribe(), "*") && !slices.Contains(req.GetResourceNamesUnsubscribe(), "*")
}

// nodeName is the NODE_NAME of a request's Node metadata, or "".
func nodeName(req *deltaRequest) string {
	return req.GetNode().GetMetadata().GetFields()["NODE_NAME"].GetStringValue()
}

// onDemandAnswerLocked answers names for st, subscribing it to every
// resource sent (generateDeltasOndemand on a request).
func (s *Server) onDemandAnswerLocked(st *stream, typeURL string, names map[string]struct{}, retained map[string]string) *deltaResponse {
	sub := st.onDemand[typeURL]
	want := make(map[string]struct{}, len(names))
	for n := range names {
		want[n] = struct{}{}
	}
	for _, n := range s.nodeLocalLocked(typeURL, st.node) {
		if _, ok := sub.names[n]; !ok {
			want[n] = struct{}{}
		}
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: s.nextNonceLocked(), Resources: []*discoveryv3.Resource{}}
	removed := map[string]struct{}{}
	have := map[string]struct{}{}
	var found []*discoveryv3.Resource
	for _, key := range sortedKeys(want) {
		rs := s.lookupLocked(typeURL, key)
		if len(rs) == 0 {
			removed[key] = struct{}{}
			continue
		}
		for _, r := range rs {
			if _, dup := have[r.GetName()]; !dup {
				have[r.GetName()] = struct{}{}
				found = append(found, r)
			}
		}
	}
	for _, r := range found {
		r = withAliases(r)
		for _, a := range r.GetAliases() {
			delete(removed, a)
		}
		sub.names[r.GetName()] = struct{}{}
		if v, ok := retained[r.GetName()]; ok && v != "" && v == r.GetVersion() {
			continue
		}
		resp.Resources = append(resp.Resources, r)
	}
	resp.RemovedResources = sortedKeys(removed)
	return resp
}

// onDemandPushLocked is the part of a push of resources that reaches st's
// named subscription, or nil, subscribing st to what it sends.
func (s *Server) onDemandPushLocked(st *stream, typeURL string, resources []*discoveryv3.Resource, nonce string) *deltaResponse {
	sub := st.onDemand[typeURL]
	var out []*discoveryv3.Resource
	for _, r := range resources {
		r = withAliases(r)
		if !s.reachesLocked(sub, st.node, r) {
			continue
		}
		sub.names[r.GetName()] = struct{}{}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil
	}
	return &discoveryv3.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: nonce, Resources: out}
}

// reachesLocked reports whether a pushed resource r concerns a named
// subscription: r or one of its aliases is subscribed, or r is a workload
// of node or an endpoint of a subscribed service.
func (s *Server) reachesLocked(sub *onDemand, node string, r *discoveryv3.Resource) bool {
	if _, ok := sub.names[r.GetName()]; ok {
		return true
	}
	for _, a := range r.GetAliases() {
		if _, ok := sub.names[a]; ok {
			return true
		}
	}
	w := decodeAddress(r).GetWorkload()
	if w == nil {
		return false
	}
	if node != "" && w.GetNode() == node {
		return true
	}
	for key := range w.GetServices() {
		if _, ok := sub.names[key]; ok {
			return true
		}
	}
	return false
}

// nodeLocalLocked returns the names of the workloads on node, sorted.
func (s *Server) nodeLocalLocked(typeURL, node string) []string {
	if node == "" || typeURL != xds.AddressTypeURL {
		return nil
	}
	var out []string
	for name, r := range s.resources[typeURL] {
		if w := decodeAddress(r).GetWorkload(); w != nil && w.GetNode() == node {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// lookupLocked finds what key names, as istiod's index.Lookup does: a
// workload uid; else, for "network/IP", the workloads with that address;
// else a service by "namespace/hostname" or by a VIP "network/IP", with
// the workloads that list it in their services. Types other than Address
// are looked up by name only.
func (s *Server) lookupLocked(typeURL, key string) []*discoveryv3.Resource {
	set := s.resources[typeURL]
	if typeURL != xds.AddressTypeURL {
		if r, ok := set[key]; ok {
			return []*discoveryv3.Resource{r}
		}
		return nil
	}
	if r, ok := set[key]; ok && decodeAddress(r).GetWorkload() != nil {
		return []*discoveryv3.Resource{r}
	}
	network, ipStr, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	ip, ipErr := netip.ParseAddr(ipStr)
	var out []*discoveryv3.Resource
	if ipErr == nil {
		for _, name := range sortedKeys(set) {
			w := decodeAddress(set[name]).GetWorkload()
			if w != nil && w.GetNetwork() == network && slices.ContainsFunc(w.GetAddresses(), func(b []byte) bool {
				a, _ := netip.AddrFromSlice(b)
				return a.Unmap() == ip
			}) {
				out = append(out, set[name])
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	svcKey := ""
	if r, ok := set[key]; ok && decodeAddress(r).GetService() != nil {
		svcKey = key
	} else if ipErr == nil {
		for _, name := range sortedKeys(set) {
			svc := decodeAddress(set[name]).GetService()
			if svc != nil && slices.ContainsFunc(svc.GetAddresses(), func(na *workloadapi.NetworkAddress) bool {
				a, _ := netip.AddrFromSlice(na.GetAddress())
				return na.GetNetwork() == network && a.Unmap() == ip
			}) {
				svcKey = name
				break
			}
		}
	}
	if svcKey == "" {
		return nil
	}
	out = append(out, set[svcKey])
	for _, name := range sortedKeys(set) {
		if w := decodeAddress(set[name]).GetWorkload(); w != nil {
			if _, ok := w.GetServices()[svcKey]; ok {
				out = append(out, set[name])
			}
		}
	}
	return out
}

// decodeAddress decodes an Address resource's payload, or returns nil.
func decodeAddress(r *discoveryv3.Resource) *workloadapi.Address {
	var a workloadapi.Address
	if r.GetResource().GetTypeUrl() != xds.AddressTypeURL || proto.Unmarshal(r.GetResource().GetValue(), &a) != nil {
		return nil
	}
	return &a
}

// withAliases returns r with the aliases istiod gives an Address resource
// (AddressInfo.Aliases): "network/IP" of each workload address, and
// "network/IP" or "network/IP/length" of each service address.
func withAliases(r *discoveryv3.Resource) *discoveryv3.Resource {
	a := decodeAddress(r)
	if a == nil {
		return r
	}
	var aliases []string
	if w := a.GetWorkload(); w != nil {
		for _, b := range w.GetAddresses() {
			ip, _ := netip.AddrFromSlice(b)
			aliases = append(aliases, w.GetNetwork()+"/"+ip.String())
		}
	}
	if svc := a.GetService(); svc != nil {
		for _, na := range svc.GetAddresses() {
			ip, _ := netip.AddrFromSlice(na.GetAddress())
			if na.Length != nil {
				aliases = append(aliases, fmt.Sprintf("%s/%s/%d", na.GetNetwork(), ip, na.GetLength()))
			} else {
				aliases = append(aliases, na.GetNetwork()+"/"+ip.String())
			}
		}
	}
	if len(aliases) == 0 {
		return r
	}
	r = proto.Clone(r).(*discoveryv3.Resource)
	r.Aliases = aliases
	return r
}
