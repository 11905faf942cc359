package xdsserver

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/xds"
)

// WorkloadResource wraps w in an Address resource named by its uid, as
// istiod names it. The version is left empty (Push assigns one).
func WorkloadResource(w *workloadapi.Workload) *discoveryv3.Resource {
	return resource(w.GetUid(), xds.WorkloadAddress(w))
}

// ServiceResource wraps s in an Address resource named
// "namespace/hostname", as istiod names it.
func ServiceResource(s *workloadapi.Service) *discoveryv3.Resource {
	return resource(s.GetNamespace()+"/"+s.GetHostname(), xds.ServiceAddress(s))
}

// PolicyResource wraps p in an Authorization resource named
// "namespace/name", as istiod names it.
func PolicyResource(p *security.Authorization) *discoveryv3.Resource {
	return resource(p.GetNamespace()+"/"+p.GetName(), p)
}

// resource marshals m (deterministically) into a named resource. It panics
// if m cannot be marshaled (for example a string that is not UTF-8): build
// such resources by hand.
func resource(name string, m proto.Message) *discoveryv3.Resource {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		panic(fmt.Sprintf("xdsserver: marshal %s: %v", name, err))
	}
	return &discoveryv3.Resource{Name: name, Resource: a}
}

// PushWorkload pushes workloads as Address resources, in one response,
// and returns its nonce.
func (s *Server) PushWorkload(ws ...*workloadapi.Workload) (nonce string) {
	rs := make([]*discoveryv3.Resource, len(ws))
	for i, w := range ws {
		rs[i] = WorkloadResource(w)
	}
	return s.Push(xds.AddressTypeURL, rs...)
}

// PushService pushes services as Address resources, in one response,
// and returns its nonce.
func (s *Server) PushService(ss ...*workloadapi.Service) (nonce string) {
	rs := make([]*discoveryv3.Resource, len(ss))
	for i, svc := range ss {
		rs[i] = ServiceResource(svc)
	}
	return s.Push(xds.AddressTypeURL, rs...)
}

// PushPolicy pushes policies as Authorization resources, in one response,
// and returns its nonce.
func (s *Server) PushPolicy(ps ...*security.Authorization) (nonce string) {
	rs := make([]*discoveryv3.Resource, len(ps))
	for i, p := range ps {
		rs[i] = PolicyResource(p)
	}
	return s.Push(xds.AuthorizationTypeURL, rs...)
}
