package state

import (
	"cmp"
	"hash/maphash"
	"iter"
	"net/netip"
	"slices"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/internal/hashindex"
	"github.com/gozt/gozt/rbac"
)

// ipKey indexes an address on a network. Both fields are comparable, so a
// map lookup with it allocates nothing.
type ipKey struct {
	network string
	addr    netip.Addr
}

// ipSlot indexes a workload address on a network in byIP. It holds no
// pointer (the network by its number in netIDs, the address by its 16
// bytes; stored addresses are unmapped and never zoned), and byIP's values
// are slot numbers, so byIP's tables hold no pointer at all and a garbage
// collection skips them instead of scanning 100,000 entries of a large
// store.
type ipSlot struct {
	net  uint32
	addr [16]byte
}

// nameSeed seeds nameHash.
var nameSeed = maphash.MakeSeed()

// nameHash keys byName: a hash of a workload's name, so that byName's
// tables, like byIP's, hold no pointer and a garbage collection skips them
// (keyed by strings, byName was a sixth to a quarter of a 100,000-workload
// store's mark work). The namespace is left out so that one index serves
// both FindWorkload and WorkloadsByName (the DNS proxy's pod names): the
// workloads of one name in every namespace share a list, usually of one (a
// StatefulSet's pod names recur across namespaces, a Deployment's do not),
// and a lookup checks the namespace. Workloads whose keys collide share a
// list too, and a lookup checks the name. Tests replace it to make names
// collide.
var nameHash = func(name string) uint64 { return maphash.String(nameSeed, name) }

// uidSeed seeds uidHash.
var uidSeed = maphash.MakeSeed()

// uidHash keys byUID (keyed by the uid strings, the table cost a
// 100,000-workload store about 4 ms of mark CPU per collection,
// BenchmarkStoreMark100k). Tests replace it to make uids collide.
var uidHash = func(uid string) uint64 { return maphash.String(uidSeed, uid) }

// cidrEntry is one CIDR VIP of a service.
type cidrEntry struct {
	network string
	prefix  netip.Prefix
	key     string // service key
}

var _ rbac.SetSource = (*Snapshot)(nil)

// Snapshot is an immutable view of the store at one point in time.
//
// Invariants:
//   - Nothing reachable from a published Snapshot is ever modified; a Batch
//     copies every map or slice it changes (copy-on-write per batch). The
//     exceptions are the store's workloadTables (wt), shared by all its
//     snapshots: later batches append shared entries past the end of this
//     snapshot's slice of them (never over it) and change the writer's own
//     fields, which no reader reads, and the cache of built workloads is
//     replaced entry by entry (atomically; an entry is only ever used for
//     the record it was built from).
//   - Every workload is a record (record.go) in recs, whose shared index
//     names an entry of shared.
//   - byIP holds only Standard-network-mode workloads, each list ordered by
//     preference (SPEC §3.4): Pod with HBONE, Pod, HBONE, any; then by uid.
//   - byVIP and cidrs hold service keys, resolved through services, so a
//     service whose endpoints change only needs its services entry replaced.
//   - byHostname lists are ordered by namespace and point at the current
//     services entries.
//   - members holds, per service key, every endpoint named by any workload,
//     healthy or not, whether or not the service exists, as an EndpointSet
//     (no pointer per endpoint); Service.Endpoints is derived from it
//     (filtered by health policy, else the same set) and StagedEndpoints is
//     the part whose service has not arrived.
//   - nsPolicies holds only Namespace-scoped policies and global only
//     Global-scoped ones, each an rbac.Set (indexed for Evaluate) sorted by
//     key; nsPolicies has no entry for a namespace without policies.
type Snapshot struct {
	gen uint64
	// recs holds every workload's record (record.go) at its slot number
	// ("": a free slot, listed in free); byUID maps a uid to its slot.
	// shared is the store's table of shared entries as it was when the
	// snapshot was made (records name entries by index), and wt the
	// store's tables, with the cache of built workloads.
	recs   []string
	free   []int32
	byUID  hashindex.Index
	shared []wshared
	wt     *workloadTables
	// byIP indexes addresses, each list ordered by preference; netIDs
	// numbers the networks seen from 1, for ipSlot (0 is the default
	// network, ""). byName indexes nameHash(name), each list ordered by
	// uid.
	byIP       slotIndex[ipSlot]
	netIDs     map[string]uint32
	byName     slotIndex[uint64]
	services   map[string]*Service
	byVIP      map[ipKey][]string
	cidrs      []cidrEntry
	byHostname map[string][]*Service
	policies   map[string]*rbac.Policy
	nsPolicies map[string]*rbac.Set
	global     *rbac.Set
	members    map[string]EndpointSet
	changes    Changes
}

// Changes says what the update that published a snapshot changed, so that
// Config.OnUpdate consumers (RBAC re-check, certificate prefetch) need not
// diff whole snapshots.
type Changes struct {
	// Reset reports whether the update started with Batch.Reset: then
	// anything may have changed, including removals not listed below.
	Reset bool
	// Workloads lists the uids inserted, replaced or removed, sorted.
	Workloads []string
	// Services lists the service keys whose definition or endpoints
	// (staged ones included) changed, sorted.
	Services []string
	// Policies lists the policy keys inserted, replaced or removed, sorted.
	Policies []string
}

// Changes returns what the update that published s changed (nothing for
// the initial empty snapshot). The slices are shared: do not modify them.
func (s *Snapshot) Changes() Changes { return s.changes }

func emptySnapshot() *Snapshot { return emptySnapshotWith(newWorkloadTables()) }

// emptySnapshotWith returns an empty snapshot of the store whose tables are
// wt.
func emptySnapshotWith(wt *workloadTables) *Snapshot {
	return &Snapshot{
		shared:     wt.ents,
		wt:         wt,
		byUID:      hashindex.New(uidHash),
		byIP:       newSlotIndex[ipSlot](),
		netIDs:     map[string]uint32{},
		byName:     newSlotIndex[uint64](),
		services:   map[string]*Service{},
		byVIP:      map[ipKey][]string{},
		byHostname: map[string][]*Service{},
		policies:   map[string]*rbac.Policy{},
		nsPolicies: map[string]*rbac.Set{},
		members:    map[string]EndpointSet{},
	}
}

// Generation returns the number of updates published before this snapshot
// (0 for the empty initial snapshot).
func (s *Snapshot) Generation() uint64 { return s.gen }

// WorkloadByIP returns the workload with address ip on network, or nil.
// HostNetwork workloads are not indexed. When several workloads share the
// address, a Pod speaking HBONE is preferred, then a Pod, then HBONE, then
// any (SPEC §3.4), ties broken by uid.
func (s *Snapshot) WorkloadByIP(network string, ip netip.Addr) *Workload {
	k, ok := s.ipSlotOf(network, ip)
	if !ok {
		return nil
	}
	return s.at(s.byIP.first(k))
}

// ipSlotOf returns byIP's key for ip on network; false if no workload can
// have it (a network no workload is on, or a zoned address).
func (s *Snapshot) ipSlotOf(network string, ip netip.Addr) (ipSlot, bool) {
	var id uint32 // the default network, "", is 0 and not in netIDs
	if network != "" {
		var ok bool
		if id, ok = s.netIDs[network]; !ok {
			return ipSlot{}, false
		}
	}
	if ip.Zone() != "" {
		return ipSlot{}, false
	}
	return ipSlot{id, ip.Unmap().As16()}, true
}

// WorkloadByUID returns the workload with the given uid, or nil.
func (s *Snapshot) WorkloadByUID(uid string) *Workload {
	if slot, ok := s.slotOf(uid); ok {
		return s.at(slot)
	}
	return nil
}

// at returns the workload at slot (nil for a free slot, or slot -1): the
// one the store's cache holds for the slot's record, or a new one built
// from it, which then replaces the cache's. Records never change, so an
// entry built from the same record is the same workload.
func (s *Snapshot) at(slot int32) *Workload {
	if slot < 0 {
		return nil
	}
	rec := s.recs[slot]
	if rec == "" {
		return nil
	}
	e := &s.wt.cache[uint32(slot)%cacheSize]
	if bw := e.Load(); bw != nil && sameString(bw.rec, rec) {
		return &bw.Workload
	}
	bw := s.build(rec)
	e.Store(bw)
	return &bw.Workload
}

// build returns a new workload built from rec, one of s's records.
func (s *Snapshot) build(rec string) *builtWorkload {
	return buildWorkload(rec, &s.shared[recSharedOf(rec)])
}

// WorkloadNames is what names a workload and its identity: what consumers
// of a large change (OnUpdate after a push of 100,000 workloads) read of
// each changed workload, which WorkloadNamesByUID gives without building
// the whole workload.
type WorkloadNames struct {
	Namespace, Name, Node string
	Identity              identity.Identity
}

// Names returns w's names and identity.
func (w *Workload) Names() WorkloadNames {
	return WorkloadNames{Namespace: w.Namespace, Name: w.Name, Node: w.Node, Identity: w.Identity()}
}

// WorkloadNamesByUID returns the names of the workload with the given uid,
// as WorkloadByUID(uid).Names() would; false if there is none.
func (s *Snapshot) WorkloadNamesByUID(uid string) (WorkloadNames, bool) {
	slot, ok := s.slotOf(uid)
	if !ok {
		return WorkloadNames{}, false
	}
	var f [recNumStrings]string
	recStrings(s.recs[slot], recNode, &f)
	w := Workload{Namespace: f[recNamespace], Name: f[recName], Node: f[recNode],
		TrustDomain: f[recTrustDomain], ServiceAccount: f[recServiceAccount]}
	return w.Names(), true
}

// slotOf returns the slot of the workload with the given uid; false if
// there is none.
func (s *Snapshot) slotOf(uid string) (int32, bool) { return s.byUID.Get(uid, s.holdsUID) }

// uidAt returns the uid of the workload at slot.
func (s *Snapshot) uidAt(slot int32) string { return recUIDOf(s.recs[slot]) }

// holdsUID reports whether the workload at slot has the given uid.
func (s *Snapshot) holdsUID(slot int32, uid string) bool { return recUIDOf(s.recs[slot]) == uid }

// numWorkloads returns the number of workloads: the slots not free.
func (s *Snapshot) numWorkloads() int { return len(s.recs) - len(s.free) }

// FindWorkload returns the workload named namespace/name with the given
// service account (compared after defaulting, see Workload.Identity) on
// node, or nil; node "" matches any node. It is how a proxy finds the local
// workload it serves from the pod information istio-cni gives (SPEC §3.1).
// Several matches (which xDS should not produce) resolve to the lowest uid.
func (s *Snapshot) FindWorkload(node, namespace, name, serviceAccount string) *Workload {
	if serviceAccount == "" {
		serviceAccount = DefaultServiceAccount
	}
	var buf [4]int32
	for _, slot := range s.byName.slots(nameHash(name), buf[:0]) {
		var f [recNumStrings]string
		recStrings(s.recs[slot], recNode, &f)
		sa := f[recServiceAccount]
		if f[recNamespace] == namespace && f[recName] == name && (node == "" || f[recNode] == node) &&
			(sa == serviceAccount || (sa == "" && serviceAccount == DefaultServiceAccount)) {
			return s.at(slot)
		}
	}
	return nil
}

// WorkloadsByName yields the workloads named name, in every namespace, in
// uid order: the pods a DNS name of a headless service's pod may mean
// (proxy/dns). It builds only the workloads it yields.
func (s *Snapshot) WorkloadsByName(name string) iter.Seq[*Workload] {
	return func(yield func(*Workload) bool) {
		var buf [4]int32
		for _, slot := range s.byName.slots(nameHash(name), buf[:0]) {
			var f [recNumStrings]string
			recStrings(s.recs[slot], recName, &f)
			if f[recName] == name && !yield(s.at(slot)) {
				return
			}
		}
	}
}

// WorkloadByHostname returns a workload of namespace whose hostname is
// hostname, or nil. It scans every workload: hostname-named waypoints and
// gateways without a service are rare, and an index would cost memory on
// every node.
func (s *Snapshot) WorkloadByHostname(namespace, hostname string) *Workload {
	if hostname == "" {
		return nil
	}
	for slot, rec := range s.recs {
		if rec == "" {
			continue
		}
		var f [recNumStrings]string
		recStrings(rec, recHostname, &f)
		if f[recHostname] == hostname && f[recNamespace] == namespace {
			return s.at(int32(slot))
		}
	}
	return nil
}

// ServiceByKey returns the service "namespace/hostname", or nil.
func (s *Snapshot) ServiceByKey(key string) *Service { return s.services[key] }

// ServicesByHostname returns the services with that hostname, ordered by
// namespace. The slice is shared: do not modify it.
func (s *Snapshot) ServicesByHostname(hostname string) []*Service {
	return s.byHostname[hostname]
}

// visibleTo reports whether a client in namespace clientNS may see svc.
func visibleTo(svc *Service, clientNS string) bool {
	return svc.Visibility != VisibilityNamespace || svc.Namespace == clientNS
}

// ServiceByVIP returns the service that a client in namespace clientNS
// reaches at ip on network, or nil (SPEC §3.4). Services with Namespace
// visibility are hidden from clients in other namespaces. Among exact VIP
// matches a service in the client's namespace wins, then a canonical one,
// then the first inserted. With no exact match, CIDR VIPs are ranked by
// (in the client's namespace, longest prefix, canonical), ties going to the
// first inserted.
func (s *Snapshot) ServiceByVIP(network string, ip netip.Addr, clientNS string) *Service {
	ip = ip.Unmap()
	var best *Service
	for _, k := range s.byVIP[ipKey{network, ip}] {
		svc := s.services[k]
		if svc == nil || !visibleTo(svc, clientNS) {
			continue
		}
		if clientNS != "" && svc.Namespace == clientNS {
			return svc
		}
		if best == nil || (svc.Canonical && !best.Canonical) {
			best = svc
		}
	}
	if best != nil {
		return best
	}
	return s.serviceByCIDR(network, ip, clientNS)
}

// cidrRank orders CIDR VIP candidates; a larger rank is better.
type cidrRank struct {
	inNamespace bool
	bits        int
	canonical   bool
}

func (r cidrRank) better(o cidrRank) bool {
	if r.inNamespace != o.inNamespace {
		return r.inNamespace
	}
	if r.bits != o.bits {
		return r.bits > o.bits
	}
	return r.canonical && !o.canonical
}

func (s *Snapshot) serviceByCIDR(network string, ip netip.Addr, clientNS string) *Service {
	var best *Service
	var bestRank cidrRank
	for i := range s.cidrs {
		e := &s.cidrs[i]
		if e.network != network || !e.prefix.Contains(ip) {
			continue
		}
		svc := s.services[e.key]
		if svc == nil || !visibleTo(svc, clientNS) {
			continue
		}
		r := cidrRank{clientNS != "" && svc.Namespace == clientNS, e.prefix.Bits(), svc.Canonical}
		if best == nil || r.better(bestRank) {
			best, bestRank = svc, r
		}
	}
	return best
}

// RangeWorkloadNames calls fn with the namespace, name, workload name
// (WorkloadName, "" if unset) and cluster of every workload, in no order,
// without building the workloads: a scan of a 100,000-workload store
// allocates nothing. The strings are substrings of the store's records.
func (s *Snapshot) RangeWorkloadNames(fn func(namespace, name, workloadName, cluster string)) {
	var f [recNumStrings]string
	for _, rec := range s.recs {
		if rec != "" {
			recStrings(rec, recClusterID, &f)
			fn(f[recNamespace], f[recName], f[recWorkloadName], f[recClusterID])
		}
	}
}

// Workloads returns every workload sorted by uid, in a new slice. They are
// built anew (not through the cache, which a large store would only
// churn).
func (s *Snapshot) Workloads() []*Workload {
	out := make([]*Workload, 0, s.numWorkloads())
	for _, rec := range s.recs {
		if rec != "" {
			out = append(out, &s.build(rec).Workload)
		}
	}
	slices.SortFunc(out, func(a, b *Workload) int { return cmp.Compare(a.UID, b.UID) })
	return out
}

// Services returns every service sorted by hostname, then namespace, in a
// new slice.
func (s *Snapshot) Services() []*Service {
	out := make([]*Service, 0, len(s.services))
	for _, svc := range s.services {
		out = append(out, svc)
	}
	slices.SortFunc(out, compareServices)
	return out
}

func compareServices(a, b *Service) int {
	if c := cmp.Compare(a.Hostname, b.Hostname); c != 0 {
		return c
	}
	return cmp.Compare(a.Namespace, b.Namespace)
}

// Policies returns every policy sorted by key, in a new slice.
func (s *Snapshot) Policies() []*rbac.Policy {
	out := make([]*rbac.Policy, 0, len(s.policies))
	for _, p := range s.policies {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePolicies)
	return out
}

// comparePolicies orders policies by key ("namespace/name") without
// building the keys.
func comparePolicies(a, b *rbac.Policy) int {
	if a.Namespace == b.Namespace {
		return cmp.Compare(a.Name, b.Name)
	}
	n := min(len(a.Namespace), len(b.Namespace))
	if c := cmp.Compare(a.Namespace[:n], b.Namespace[:n]); c != 0 {
		return c
	}
	// One namespace is a prefix of the other: the shorter key goes on
	// with '/', which validation keeps out of namespaces.
	if len(a.Namespace) < len(b.Namespace) {
		if c := cmp.Compare('/', b.Namespace[n]); c != 0 {
			return c
		}
	} else if c := cmp.Compare(a.Namespace[n], '/'); c != 0 {
		return c
	}
	return cmp.Compare(a.Key(), b.Key())
}

// StagedEndpoints returns, per service key whose service has not arrived,
// the endpoints waiting for it, in a new map.
func (s *Snapshot) StagedEndpoints() map[string]EndpointSet {
	out := map[string]EndpointSet{}
	for key, eps := range s.members {
		if _, ok := s.services[key]; !ok {
			out[key] = eps
		}
	}
	return out
}

// NamespacePolicies returns the Namespace-scoped policies of namespace ns,
// sorted by key. The slice is shared: do not modify it.
func (s *Snapshot) NamespacePolicies(ns string) []*rbac.Policy {
	return s.nsPolicies[ns].Policies()
}

// GlobalPolicies returns the Global-scoped policies sorted by key. The slice
// is shared: do not modify it.
func (s *Snapshot) GlobalPolicies() []*rbac.Policy { return s.global.Policies() }

// NamespaceSet returns NamespacePolicies(ns) as an indexed rbac.Set, or nil
// when there are none. rbac.Evaluate uses it to match only the candidate
// policies of a connection.
func (s *Snapshot) NamespaceSet(ns string) *rbac.Set { return s.nsPolicies[ns] }

// GlobalSet returns GlobalPolicies() as an indexed rbac.Set, or nil when
// there are none.
func (s *Snapshot) GlobalSet() *rbac.Set { return s.global }

// Policy returns the policy with key "namespace/name", or nil.
func (s *Snapshot) Policy(key string) *rbac.Policy { return s.policies[key] }

// Counts returns the number of workloads, services and policies.
func (s *Snapshot) Counts() (workloads, services, policies int) {
	return s.numWorkloads(), len(s.services), len(s.policies)
}
