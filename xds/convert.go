package xds

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"

	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// Conversion from Istio's wire types (istio.io/istio/pkg/workloadapi, SPEC
// §5.4) to state values. The *FromProto functions are pure: they read
// the proto, apply the xDS defaults, check everything the store and the data
// path rely on, and return a value the store accepts, or an error saying what
// is wrong. They run once per resource, off the store lock and off the data
// path (STYLE 39).

// Defaults applied to workloads received over xDS (SPEC §5.4). The local
// config does not apply them (SPEC §5.5).
const (
	xdsDefaultTrustDomain    = state.DefaultTrustDomain
	xdsDefaultServiceAccount = state.DefaultServiceAccount
	xdsDefaultClusterID      = "Kubernetes"
)

// addressFromProto converts an istio.workload.Address, which carries either
// a workload or a service: exactly one of w and s is non-nil when err is nil.
// The workload's repeated strings are taken from in, if non-nil.
func addressFromProto(a *workloadapi.Address, in interner) (w *state.Workload, s *state.Service, err error) {
	switch t := a.GetType().(type) {
	case *workloadapi.Address_Workload:
		w, err = workloadFromProtoIn(t.Workload, in)
		return w, nil, err
	case *workloadapi.Address_Service:
		s, err = ServiceFromProto(t.Service)
		return nil, s, err
	}
	return nil, nil, errors.New("address: neither workload nor service set")
}

// WorkloadAddress wraps w in an istio.workload.Address, as istiod sends it
// (the fake control plane, xds/xdsserver, builds its resources with it).
func WorkloadAddress(w *workloadapi.Workload) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// ServiceAddress wraps s in an istio.workload.Address.
func ServiceAddress(s *workloadapi.Service) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

// workloadFromProtoIn converts an istio.workload.Workload, with the strings
// that many workloads share taken from in, if non-nil. It applies the xDS
// defaults (trust domain "cluster.local", service account "default", cluster
// "Kubernetes", capacity 1 when unset) and rejects what ztunnel rejects or
// what the data path cannot use: an empty uid, an address that is not 4 or
// 16 bytes, the LEGACY_ISTIO_MTLS tunnel protocol, unknown enum values, a
// port above 65535, a gateway address without a destination, and a service
// key that is not "namespace/hostname".
func workloadFromProtoIn(p *workloadapi.Workload, in interner) (*state.Workload, error) {
	if p == nil {
		return nil, errors.New("workload: nil")
	}
	if p.GetUid() == "" {
		return nil, fmt.Errorf("workload %s/%s: empty uid", p.GetNamespace(), p.GetName())
	}
	w, err := workloadFromProto(p, in)
	if err != nil {
		return nil, fmt.Errorf("workload %q: %w", p.GetUid(), err)
	}
	return w, nil
}

func workloadFromProto(p *workloadapi.Workload, in interner) (*state.Workload, error) {
	w := &state.Workload{
		UID:                   p.GetUid(),
		Name:                  p.GetName(),
		Namespace:             in.str(p.GetNamespace()),
		Hostname:              p.GetHostname(),
		Network:               in.str(p.GetNetwork()),
		TrustDomain:           orDefault(in.str(p.GetTrustDomain()), xdsDefaultTrustDomain),
		ServiceAccount:        orDefault(in.str(p.GetServiceAccount()), xdsDefaultServiceAccount),
		Node:                  in.str(p.GetNode()),
		CanonicalName:         in.str(p.GetCanonicalName()),
		CanonicalRevision:     in.str(p.GetCanonicalRevision()),
		WorkloadName:          in.str(p.GetWorkloadName()),
		NativeTunnel:          p.GetNativeTunnel(),
		AuthorizationPolicies: in.strs(nilIfEmpty(p.GetAuthorizationPolicies())),
		ClusterID:             orDefault(in.str(p.GetClusterId()), xdsDefaultClusterID),
		Capacity:              1,
	}
	if c := p.GetCapacity(); c != nil {
		w.Capacity = c.GetValue()
	}
	if l := p.GetLocality(); l != nil {
		w.Locality = state.Locality{Region: in.str(l.GetRegion()), Zone: in.str(l.GetZone()), Subzone: in.str(l.GetSubzone())}
	}
	var err error
	if w.Addresses, err = pbAddrs(p.GetAddresses()); err != nil {
		return nil, err
	}
	if err := workloadEnumsFromProto(p, w); err != nil {
		return nil, err
	}
	if w.Waypoint, err = pbGateway(p.GetWaypoint()); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	if w.NetworkGateway, err = pbGateway(p.GetNetworkGateway()); err != nil {
		return nil, fmt.Errorf("network_gateway: %w", err)
	}
	if w.ApplicationTunnel, err = pbAppTunnel(p.GetApplicationTunnel()); err != nil {
		return nil, err
	}
	if w.Services, err = pbWorkloadServices(p.GetServices(), in); err != nil {
		return nil, err
	}
	return w, nil
}

// workloadEnumsFromProto sets w's enum fields from p, rejecting values the
// proto does not define (proto3 enums are open: any int32 decodes).
func workloadEnumsFromProto(p *workloadapi.Workload, w *state.Workload) error {
	return workloadEnums(p.GetTunnelProtocol(), p.GetWorkloadType(), p.GetStatus(), p.GetNetworkMode(), w)
}

// workloadEnums sets w's enum fields from a workload's values (see
// workloadEnumsFromProto).
func workloadEnums(tp workloadapi.TunnelProtocol, wt workloadapi.WorkloadType, st workloadapi.WorkloadStatus, nm workloadapi.NetworkMode, w *state.Workload) error {
	switch tp {
	case workloadapi.TunnelProtocol_NONE:
		w.Protocol = state.TunnelNone
	case workloadapi.TunnelProtocol_HBONE:
		w.Protocol = state.TunnelHBONE
	case workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS:
		return errors.New("tunnel_protocol LEGACY_ISTIO_MTLS is not supported")
	default:
		return fmt.Errorf("unknown tunnel_protocol %d", tp)
	}
	if wt < workloadapi.WorkloadType_DEPLOYMENT || wt > workloadapi.WorkloadType_JOB {
		return fmt.Errorf("unknown workload_type %d", wt)
	}
	w.WorkloadType = state.WorkloadType(wt)
	if st != workloadapi.WorkloadStatus_HEALTHY && st != workloadapi.WorkloadStatus_UNHEALTHY {
		return fmt.Errorf("unknown status %d", st)
	}
	w.Status = state.HealthStatus(st)
	if nm != workloadapi.NetworkMode_STANDARD && nm != workloadapi.NetworkMode_HOST_NETWORK {
		return fmt.Errorf("unknown network_mode %d", nm)
	}
	w.NetworkMode = state.NetworkMode(nm)
	return nil
}

func pbAppTunnel(t *workloadapi.ApplicationTunnel) (*state.ApplicationTunnel, error) {
	if t == nil {
		return nil, nil
	}
	port, err := pbPort(t.GetPort())
	if err != nil {
		return nil, fmt.Errorf("application_tunnel: %w", err)
	}
	out := &state.ApplicationTunnel{Port: port}
	switch t.GetProtocol() {
	case workloadapi.ApplicationTunnel_NONE:
		out.Protocol = state.AppTunnelNone
	case workloadapi.ApplicationTunnel_PROXY:
		out.Protocol = state.AppTunnelProxy
	default:
		return nil, fmt.Errorf("application_tunnel: unknown protocol %d", t.GetProtocol())
	}
	return out, nil
}

// pbWorkloadServices converts the workload's services map ("namespace/hostname"
// → ports).
func pbWorkloadServices(m map[string]*workloadapi.PortList, in interner) (map[string]state.PortMap, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]state.PortMap, len(m))
	for key, pl := range m {
		ns, host, ok := strings.Cut(key, "/")
		if !ok || ns == "" || host == "" {
			return nil, fmt.Errorf("services: key %q is not namespace/hostname", key)
		}
		pm, err := pbPortMap(pl.GetPorts())
		if err != nil {
			return nil, fmt.Errorf("services[%q]: %w", key, err)
		}
		out[in.str(key)] = pm
	}
	return out, nil
}

// pbPortMap converts a list of ports to service port → target port; a
// repeated service port keeps the last entry. No ports give a nil map.
func pbPortMap(ports []*workloadapi.Port) (state.PortMap, error) {
	if len(ports) == 0 {
		return nil, nil
	}
	pm := make(state.PortMap, len(ports))
	for i, p := range ports {
		sp, err := pbPort(p.GetServicePort())
		if err != nil {
			return nil, fmt.Errorf("ports[%d].service_port: %w", i, err)
		}
		tp, err := pbPort(p.GetTargetPort())
		if err != nil {
			return nil, fmt.Errorf("ports[%d].target_port: %w", i, err)
		}
		pm[sp] = tp
	}
	return pm, nil
}

// pbPort narrows a proto uint32 port to 16 bits.
func pbPort(p uint32) (uint16, error) {
	if p > math.MaxUint16 {
		return 0, fmt.Errorf("port %d out of range", p)
	}
	return uint16(p), nil
}

// pbAddr converts raw address bytes, which must be 4 or 16 long.
func pbAddr(b []byte) (netip.Addr, error) {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b)), nil
	case 16:
		return netip.AddrFrom16([16]byte(b)), nil
	}
	return netip.Addr{}, fmt.Errorf("address of %d bytes, want 4 or 16", len(b))
}

func pbAddrs(bs [][]byte) ([]netip.Addr, error) {
	if len(bs) == 0 {
		return nil, nil
	}
	out := make([]netip.Addr, len(bs))
	for i, b := range bs {
		a, err := pbAddr(b)
		if err != nil {
			return nil, fmt.Errorf("addresses[%d]: %w", i, err)
		}
		out[i] = a
	}
	return out, nil
}

// pbNetworkAddress converts a NetworkAddress that must name one host: a
// length, if present, must be the full address length.
func pbNetworkAddress(a *workloadapi.NetworkAddress) (state.NetworkAddress, error) {
	ip, err := pbAddr(a.GetAddress())
	if err != nil {
		return state.NetworkAddress{}, err
	}
	if a.Length != nil && int(a.GetLength()) != ip.BitLen() {
		return state.NetworkAddress{}, fmt.Errorf("address %v: prefix length %d on a host address", ip, a.GetLength())
	}
	return state.NetworkAddress{Network: a.GetNetwork(), Address: ip}, nil
}

// pbGateway converts a waypoint or network gateway; nil stays nil. A gateway
// without a destination is an error.
func pbGateway(g *workloadapi.GatewayAddress) (*state.GatewayAddress, error) {
	if g == nil {
		return nil, nil
	}
	port, err := pbPort(g.GetHboneMtlsPort())
	if err != nil {
		return nil, fmt.Errorf("hbone_mtls_port: %w", err)
	}
	out := &state.GatewayAddress{HBONEMTLSPort: port}
	switch d := g.GetDestination().(type) {
	case *workloadapi.GatewayAddress_Hostname:
		h := d.Hostname
		if h.GetNamespace() == "" || h.GetHostname() == "" {
			return nil, errors.New("hostname destination without namespace or hostname")
		}
		out.Hostname = &state.NamespacedHostname{Namespace: h.GetNamespace(), Hostname: h.GetHostname()}
	case *workloadapi.GatewayAddress_Address:
		na, err := pbNetworkAddress(d.Address)
		if err != nil {
			return nil, err
		}
		out.Address = &na
	default:
		return nil, errors.New("no destination")
	}
	return out, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// nilIfEmpty returns nil for an empty slice, so that converted values
// compare equal however the proto spelled "empty".
func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}
