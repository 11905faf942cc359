package state

import "fmt"

// LBScope is one entry of a load balancer's routing preference (SPEC §3.3).
type LBScope uint8

const (
	ScopeRegion  LBScope = 1
	ScopeZone    LBScope = 2
	ScopeSubzone LBScope = 3
	ScopeNode    LBScope = 4
	ScopeCluster LBScope = 5
	ScopeNetwork LBScope = 6
)

// String returns "Region", "Zone", "Subzone", "Node", "Cluster" or "Network".
func (s LBScope) String() string {
	switch s {
	case ScopeRegion:
		return "Region"
	case ScopeZone:
		return "Zone"
	case ScopeSubzone:
		return "Subzone"
	case ScopeNode:
		return "Node"
	case ScopeCluster:
		return "Cluster"
	case ScopeNetwork:
		return "Network"
	}
	return fmt.Sprintf("LBScope(%d)", uint8(s))
}

// LBMode is how a service picks among endpoints.
type LBMode uint8

const (
	// LBStandard considers all endpoints (UNSPECIFIED_MODE).
	LBStandard LBMode = 0
	// LBStrict keeps only endpoints matching every routing preference.
	LBStrict LBMode = 1
	// LBFailover prefers endpoints matching the most preferences.
	LBFailover LBMode = 2
	// LBPassthrough sends traffic to the original destination.
	LBPassthrough LBMode = 3
)

// String returns "Standard", "Strict", "Failover" or "Passthrough".
func (m LBMode) String() string {
	switch m {
	case LBStandard:
		return "Standard"
	case LBStrict:
		return "Strict"
	case LBFailover:
		return "Failover"
	case LBPassthrough:
		return "Passthrough"
	}
	return fmt.Sprintf("LBMode(%d)", uint8(m))
}

// HealthPolicy says whether unhealthy endpoints are kept.
type HealthPolicy uint8

const (
	OnlyHealthy HealthPolicy = 0
	AllowAll    HealthPolicy = 1
)

// String returns "OnlyHealthy" or "AllowAll".
func (h HealthPolicy) String() string {
	switch h {
	case OnlyHealthy:
		return "OnlyHealthy"
	case AllowAll:
		return "AllowAll"
	}
	return fmt.Sprintf("HealthPolicy(%d)", uint8(h))
}

// LoadBalancer is a service's load_balancing block.
type LoadBalancer struct {
	RoutingPreference []LBScope
	Mode              LBMode
	HealthPolicy      HealthPolicy
}

// IPFamilies restricts which address family of an endpoint is used.
type IPFamilies uint8

const (
	FamiliesAutomatic IPFamilies = 0
	FamiliesIPv4Only  IPFamilies = 1
	FamiliesIPv6Only  IPFamilies = 2
	FamiliesDual      IPFamilies = 3
)

// String returns "Automatic", "IPv4", "IPv6" or "Dual" (the local config and
// config_dump spelling).
func (f IPFamilies) String() string {
	switch f {
	case FamiliesAutomatic:
		return "Automatic"
	case FamiliesIPv4Only:
		return "IPv4"
	case FamiliesIPv6Only:
		return "IPv6"
	case FamiliesDual:
		return "Dual"
	}
	return fmt.Sprintf("IPFamilies(%d)", uint8(f))
}

// Visibility restricts which clients can see a service by VIP.
type Visibility uint8

const (
	// VisibilityPublic services are visible to every client.
	VisibilityPublic Visibility = 0
	// VisibilityNamespace services are visible only to clients in the service's
	// namespace.
	VisibilityNamespace Visibility = 1
)

// String returns "Public" or "Namespace".
func (v Visibility) String() string {
	switch v {
	case VisibilityPublic:
		return "Public"
	case VisibilityNamespace:
		return "Namespace"
	}
	return fmt.Sprintf("Visibility(%d)", uint8(v))
}

// WeightedWaypoint is one entry of a service's weighted_waypoints.
type WeightedWaypoint struct {
	Destination GatewayAddress
	Weight      uint32
}

// Endpoint is a workload's membership in a service.
type Endpoint struct {
	WorkloadUID string
	Ports       PortMap // service port → target port
	Status      HealthStatus
}

// Service is one istio.workload.Service (SPEC §5.4).
type Service struct {
	Name, Namespace, Hostname string
	VIPs                      []NetworkAddress // none means headless
	CIDRVIPs                  []NetworkPrefix
	Ports                     PortMap // service port → target port (0 = named/unknown)
	SubjectAltNames           []string
	Waypoint                  *GatewayAddress // or nil
	WeightedWaypoints         []WeightedWaypoint
	LoadBalancer              *LoadBalancer // or nil (standard, only healthy)
	IPFamilies                IPFamilies
	Canonical                 bool
	Visibility                Visibility
	// Endpoints is built by the store from the workloads' Services maps;
	// whatever the caller sets is ignored.
	Endpoints EndpointSet
}

// Key returns "namespace/hostname", the service's resource name.
func (s *Service) Key() string { return HostnameKey(s.Namespace, s.Hostname) }

// healthPolicy returns the service's health policy (OnlyHealthy if unset).
func (s *Service) healthPolicy() HealthPolicy {
	if s.LoadBalancer == nil {
		return OnlyHealthy
	}
	return s.LoadBalancer.HealthPolicy
}

// admits reports whether an endpoint with status h is stored on s.
func (s *Service) admits(h HealthStatus) bool {
	return h == StatusHealthy || s.healthPolicy() == AllowAll
}
