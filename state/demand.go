package state

import (
	"context"
	"net/netip"
)

// Demander fetches an Address resource the snapshot does not hold from the
// control plane (XDS_ON_DEMAND, SPEC §5.3); xds.Client implements it.
// Demand returns once the answer is in the store (look up again in a new
// Snapshot), or with an error when none came in time or ctx ended. A
// caller treats an error like an answer that found nothing.
type Demander interface {
	Demand(ctx context.Context, key string) error
}

// AddressKey is the on-demand key of an address: "network/IP", the
// network possibly empty ("/10.0.0.5"), as ztunnel's NetworkAddress
// displays it (src/state/workload.rs) and istiod's index.Lookup parses it.
func AddressKey(network string, ip netip.Addr) string {
	return NetworkAddress{network, ip.Unmap()}.String()
}

// HostnameKey is the on-demand key of a hostname: "namespace/hostname", a
// service's (or a workload hostname's) name, as ztunnel's
// NamespacedHostname displays it.
func HostnameKey(namespace, hostname string) string {
	return namespace + "/" + hostname
}
