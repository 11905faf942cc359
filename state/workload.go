package state

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/gozt/gozt/certs/identity"
)

// Defaults applied by Workload.Identity (SPEC §5.4).
const (
	DefaultTrustDomain    = "cluster.local"
	DefaultServiceAccount = "default"
)

// TunnelProtocol is how traffic reaches a workload (workload.proto
// TunnelProtocol; LEGACY_ISTIO_MTLS is rejected at ingest).
type TunnelProtocol uint8

const (
	// TunnelNone means plain TCP.
	TunnelNone TunnelProtocol = 0
	// TunnelHBONE means HTTP/2 CONNECT over mTLS to port 15008.
	TunnelHBONE TunnelProtocol = 1
)

// String returns "TCP" or "HBONE", the config_dump spelling.
func (p TunnelProtocol) String() string {
	switch p {
	case TunnelNone:
		return "TCP"
	case TunnelHBONE:
		return "HBONE"
	}
	return fmt.Sprintf("TunnelProtocol(%d)", uint8(p))
}

// WorkloadType is the kind of Kubernetes object behind a workload.
type WorkloadType uint8

const (
	WorkloadDeployment WorkloadType = 0
	WorkloadCronJob    WorkloadType = 1
	WorkloadPod        WorkloadType = 2
	WorkloadJob        WorkloadType = 3
)

// String returns the lower-case name ("deployment", "cronjob", "pod", "job").
func (t WorkloadType) String() string {
	switch t {
	case WorkloadDeployment:
		return "deployment"
	case WorkloadCronJob:
		return "cronjob"
	case WorkloadPod:
		return "pod"
	case WorkloadJob:
		return "job"
	}
	return fmt.Sprintf("WorkloadType(%d)", uint8(t))
}

// HealthStatus is a workload's readiness.
type HealthStatus uint8

const (
	StatusHealthy   HealthStatus = 0
	StatusUnhealthy HealthStatus = 1
)

// String returns "Healthy" or "Unhealthy".
func (h HealthStatus) String() string {
	switch h {
	case StatusHealthy:
		return "Healthy"
	case StatusUnhealthy:
		return "Unhealthy"
	}
	return fmt.Sprintf("HealthStatus(%d)", uint8(h))
}

// NetworkMode says whether a workload uses the host's network namespace.
type NetworkMode uint8

const (
	// NetworkStandard workloads have their own IPs and are indexed by IP.
	NetworkStandard NetworkMode = 0
	// NetworkHost workloads share the node's IP and are not indexed by IP.
	NetworkHost NetworkMode = 1
)

// String returns "Standard" or "HostNetwork".
func (m NetworkMode) String() string {
	switch m {
	case NetworkStandard:
		return "Standard"
	case NetworkHost:
		return "HostNetwork"
	}
	return fmt.Sprintf("NetworkMode(%d)", uint8(m))
}

// AppTunnelProtocol is the protocol of a workload's application tunnel.
type AppTunnelProtocol uint8

const (
	AppTunnelNone  AppTunnelProtocol = 0
	AppTunnelProxy AppTunnelProtocol = 1 // PROXY protocol (SPEC §2.7)
)

// String returns "NONE" or "PROXY".
func (p AppTunnelProtocol) String() string {
	switch p {
	case AppTunnelNone:
		return "NONE"
	case AppTunnelProxy:
		return "PROXY"
	}
	return fmt.Sprintf("AppTunnelProtocol(%d)", uint8(p))
}

// ApplicationTunnel describes a tunnel the workload itself terminates.
type ApplicationTunnel struct {
	Protocol AppTunnelProtocol
	Port     uint16 // 0 means unset
}

// Locality is a workload's topology position.
type Locality struct {
	Region, Zone, Subzone string
}

// IsZero reports whether l has no field set.
func (l Locality) IsZero() bool { return l == Locality{} }

// PortMap maps a service port to a target port; a target of 0 means a named
// or unknown port.
type PortMap map[uint16]uint16

// NamespacedHostname names a service by namespace and hostname.
type NamespacedHostname struct {
	Namespace, Hostname string
}

// String returns "namespace/hostname", the service key.
func (n NamespacedHostname) String() string { return n.Namespace + "/" + n.Hostname }

// NetworkAddress is an IP on a network ("" is the default network).
type NetworkAddress struct {
	Network string
	Address netip.Addr
}

// String returns "network/IP" (SPEC §5.3).
func (a NetworkAddress) String() string { return a.Network + "/" + a.Address.String() }

// NetworkPrefix is a CIDR on a network.
type NetworkPrefix struct {
	Network string
	Prefix  netip.Prefix
}

// String returns "network/CIDR".
func (p NetworkPrefix) String() string { return p.Network + "/" + p.Prefix.String() }

// GatewayAddress points at a waypoint or network gateway. Exactly one of
// Hostname and Address is set.
type GatewayAddress struct {
	Hostname      *NamespacedHostname // or nil
	Address       *NetworkAddress     // or nil
	HBONEMTLSPort uint16
}

// Destination returns "namespace/hostname" or "network/IP", the spelling
// used in config_dump and the local config.
func (g *GatewayAddress) Destination() string {
	switch {
	case g.Hostname != nil:
		return g.Hostname.String()
	case g.Address != nil:
		return g.Address.String()
	}
	return ""
}

// Workload is one istio.workload.Workload (SPEC §5.4).
//
// Unlike xDS, the local config leaves TrustDomain, ServiceAccount and
// ClusterID empty when absent; Identity applies the defaults.
type Workload struct {
	UID, Name, Namespace string
	Addresses            []netip.Addr // normalised with Unmap by the store
	Hostname             string
	Network              string
	Protocol             TunnelProtocol
	TrustDomain          string          // "" means DefaultTrustDomain
	ServiceAccount       string          // "" means DefaultServiceAccount
	Waypoint             *GatewayAddress // or nil
	NetworkGateway       *GatewayAddress // or nil
	Node                 string
	CanonicalName        string
	CanonicalRevision    string
	WorkloadType         WorkloadType
	WorkloadName         string
	NativeTunnel         bool
	ApplicationTunnel    *ApplicationTunnel // or nil
	// Services maps "namespace/hostname" to service port → target port; each
	// entry makes this workload an endpoint of that service.
	Services              map[string]PortMap
	AuthorizationPolicies []string // policy keys "namespace/name"
	Status                HealthStatus
	ClusterID             string
	Locality              Locality
	NetworkMode           NetworkMode
	Capacity              uint32 // 0 means 1; see Weight
}

// Identity returns the workload's SPIFFE identity, applying the default
// trust domain and service account when they are empty.
func (w *Workload) Identity() identity.Identity {
	td, sa := w.TrustDomain, w.ServiceAccount
	if td == "" {
		td = DefaultTrustDomain
	}
	if sa == "" {
		sa = DefaultServiceAccount
	}
	return identity.Identity{TrustDomain: td, Namespace: w.Namespace, ServiceAccount: sa}
}

// Weight returns the workload's load-balancing weight: Capacity, or 1 when
// Capacity is 0.
func (w *Workload) Weight() uint32 {
	if w.Capacity == 0 {
		return 1
	}
	return w.Capacity
}

// IsPod reports whether the workload is a Kubernetes Pod, judged by its uid
// ("cluster//Pod/namespace/name").
func (w *Workload) IsPod() bool { return isPodUID(w.UID) }

// isPodUID reports whether uid is a Kubernetes Pod's.
func isPodUID(uid string) bool { return strings.Contains(uid, "//Pod/") }

// HasAddress reports whether ip is one of the workload's addresses.
func (w *Workload) HasAddress(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, a := range w.Addresses {
		if a == ip {
			return true
		}
	}
	return false
}
