package state

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/gozt/gozt/rbac"
)

// Batch collects changes for one Store.Update. It is used by one goroutine
// and must not be kept after the Update callback returns.
//
// Copy-on-write: next starts as a shallow copy of the base snapshot; the
// first change to each table clones it (the own* flags), and per-key inner
// maps and slices are replaced, never mutated in place, unless they were
// created in this batch (thawed, fresh).
type Batch struct {
	base *Snapshot
	next *Snapshot
	done bool

	changed bool

	ownWorkloads, ownByIP, ownByName, ownServices, ownByVIP, ownByHostname bool
	ownPolicies, ownNSPolicies, ownMembers                                 bool
	ownFree, ownByIPMore, ownNetIDs, ownByNameMore                         bool

	chWorkloads map[string]bool // uids changed in this batch
	chPolicies  map[string]bool // policy keys changed in this batch
	reset       bool

	// thawed holds, for each key whose members this batch changed, its
	// members as a map the batch may modify; commit freezes them into
	// members.
	thawed map[string]map[string]Endpoint
	fresh  map[string]bool // services[key] values created in this batch
	dirty  map[string]bool // service keys whose endpoints or definition changed

	// The policy indexes (nsPolicies, global) are brought up to date once,
	// by flushPolicyIndex at commit (or Batch.Snapshot), so that a batch of
	// n policy changes costs O(n log n) rather than a copy and sort of a
	// namespace's list per change. Until then:
	//   - nsAdded has an entry for each namespace whose list changed, holding
	//     the Namespace-scoped policies inserted into it; globalDirty and
	//     globalAdded are the same for the Global list;
	//   - dropped holds every policy that has left the policies table during
	//     the batch (removed or replaced) and not come back. A policy is
	//     immutable once stored, so an indexed or added policy belongs in
	//     its list exactly when it is not in dropped.
	nsAdded     map[string][]*rbac.Policy
	globalDirty bool
	globalAdded []*rbac.Policy
	dropped     map[*rbac.Policy]bool

	// reserve is the number of workloads the caller expects to insert
	// (Reserve): the workload tables are copied with room for them.
	reserve int

	// Scratch space reused by every workload change: the new record is
	// encoded in enc (its shared entry's key built in key), the replaced
	// or removed workload decoded into old (its addresses in oldAddrs), and
	// an index's list gathered in list.
	enc      []byte
	key      []byte
	old      Workload
	oldAddrs []netip.Addr
	list     []int32
}

func newBatch(base *Snapshot) *Batch {
	next := *base
	return &Batch{
		base:        base,
		next:        &next,
		chWorkloads: map[string]bool{},
		chPolicies:  map[string]bool{},
		thawed:      map[string]map[string]Endpoint{},
		fresh:       map[string]bool{},
		dirty:       map[string]bool{},
		nsAdded:     map[string][]*rbac.Policy{},
		dropped:     map[*rbac.Policy]bool{},
	}
}

func (b *Batch) checkOpen() {
	if b.done {
		panic("state: Batch used after Update returned")
	}
}

// commit finishes the batch and returns the snapshot to publish, or nil if
// nothing changed.
func (b *Batch) commit() *Snapshot {
	b.done = true
	if !b.changed {
		return nil
	}
	b.freezeMembers()
	for key := range b.dirty {
		b.refreshService(key)
	}
	b.flushPolicyIndex()
	if b.next.wt.shouldCompact() {
		b.ownWorkloadTable()
		b.next.wt.compact(b.next.recs)
	}
	b.next.shared = b.next.wt.ents
	b.next.gen = b.base.gen + 1
	b.next.changes = Changes{
		Reset:     b.reset,
		Workloads: sortedKeys(b.chWorkloads),
		Services:  sortedKeys(b.dirty),
		Policies:  sortedKeys(b.chPolicies),
	}
	return b.next
}

// sortedKeys returns m's keys in order, or nil if m is empty.
func sortedKeys(m map[string]bool) []string {
	if len(m) == 0 {
		return nil
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Reserve tells the batch that about n workloads it does not hold yet are
// about to be inserted (updates of stored ones take their old slots),
// so that the workload tables it copies (the first change to each copies
// it) are sized for them once, rather than grown step by step: growing a
// table leaves its earlier, smaller copies behind for the garbage
// collector. It is a hint, with no effect on the result; a table already
// copied in this batch is not resized.
func (b *Batch) Reserve(n int) {
	b.checkOpen()
	b.reserve = max(b.reserve, n)
	if len(b.chWorkloads) == 0 && n > 0 {
		b.chWorkloads = make(map[string]bool, n)
	}
}

// cloneFor copies m with room for extra more entries. A small extra (under
// an eighth of m) is left to the map's own growth, since copying entry by
// entry is slower than maps.Clone's copy of the whole table.
func cloneFor[M ~map[K]V, K comparable, V any](m M, extra int) M {
	if extra <= len(m)/8 {
		return maps.Clone(m)
	}
	c := make(M, len(m)+extra)
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Reset removes every workload, service, policy and staged endpoint, so that
// the rest of the batch rebuilds the state from scratch (local config).
func (b *Batch) Reset() {
	b.checkOpen()
	fresh := emptySnapshotWith(b.base.wt) // its entries stay valid, and its cache
	fresh.gen = b.base.gen
	b.next = fresh
	b.ownWorkloads, b.ownByIP, b.ownByName, b.ownServices, b.ownByVIP = true, true, true, true, true
	b.ownByHostname, b.ownPolicies, b.ownNSPolicies, b.ownMembers = true, true, true, true
	b.ownFree, b.ownByIPMore, b.ownNetIDs, b.ownByNameMore = true, true, true, true
	clear(b.thawed)
	clear(b.fresh)
	clear(b.dirty)
	clear(b.chWorkloads)
	clear(b.chPolicies)
	clear(b.nsAdded)
	b.globalDirty, b.globalAdded = false, nil
	clear(b.dropped)
	b.reset = true
	b.changed = true
}

// InsertWorkload adds w, replacing any workload with the same uid, and
// updates the endpoints of the services it names. It returns an error, and
// changes nothing, if w is invalid. The store keeps w's fields in a record
// of its own (addresses normalised with Unmap), except its services,
// policies, gateways and application tunnel, which it shares with every
// workload that has the same ones: the caller must not modify those
// afterwards.
func (b *Batch) InsertWorkload(w *Workload) error {
	b.checkOpen()
	if err := validateWorkload(w); err != nil {
		return err
	}
	sh := b.next.wt.intern(w, &b.key)
	b.next.shared = b.next.wt.ents // so that Batch.Snapshot's view can build it
	b.enc = appendRecord(b.enc[:0], w, sh)
	slot, had := b.next.slotOf(w.UID)
	var old *Workload
	if had {
		prev := b.next.recs[slot]
		if prev == string(b.enc) {
			// The same workload: nothing to index, and the record (with
			// the cache's workload built from it) stays.
			b.chWorkloads[recUIDOf(prev)] = true
			b.changed = true
			return nil
		}
		old = b.decodeOld(prev)
	}
	b.ownWorkloadTable()
	if !had {
		slot = b.takeSlot()
	}
	rec := string(b.enc)
	b.next.recs[slot] = rec
	uid := recUIDOf(rec)
	if !had {
		b.next.byUID.Add(uid, slot, b.next.uidAt)
	}
	b.reindexWorkloadIPs(slot, old, w)
	b.reindexWorkloadName(slot, old, w)
	b.updateEndpoints(old, w, uid)
	b.chWorkloads[uid] = true
	b.changed = true
	return nil
}

// decodeOld decodes rec, a stored record about to be replaced or removed,
// into the batch's scratch workload and returns it (valid until the next
// call).
func (b *Batch) decodeOld(rec string) *Workload {
	b.oldAddrs = decodeRecord(rec, &b.next.shared[recSharedOf(rec)], &b.old, b.oldAddrs)
	return &b.old
}

// RemoveWorkload removes the workload with the given uid and its endpoints.
// It reports whether the workload existed.
func (b *Batch) RemoveWorkload(uid string) bool {
	b.checkOpen()
	slot, had := b.next.slotOf(uid)
	if !had {
		return false
	}
	old := b.decodeOld(b.next.recs[slot])
	b.ownWorkloadTable()
	b.next.byUID.Delete(uid)
	b.next.recs[slot] = ""
	b.ownFreeList()
	b.next.free = append(b.next.free, slot)
	b.reindexWorkloadIPs(slot, old, nil)
	b.reindexWorkloadName(slot, old, nil)
	b.updateEndpoints(old, nil, old.UID)
	// A copy: the removed record's own uid would keep the record alive as
	// long as the snapshot's Changes.
	b.chWorkloads[strings.Clone(old.UID)] = true
	b.changed = true
	return true
}

// InsertService adds s, replacing any service with the same key. Endpoints
// come from workloads: staged endpoints attach when the service arrives and
// a replaced service keeps its endpoints. It returns an error, and changes
// nothing, if s is invalid. The store keeps its own copy of s; s.Endpoints
// is ignored; s's other maps and slices are shared, so the caller must not
// modify them afterwards.
func (b *Batch) InsertService(s *Service) error {
	b.checkOpen()
	if err := validateService(s); err != nil {
		return err
	}
	sc := normalizeService(s)
	key := sc.Key()
	old := b.next.services[key]
	b.ownServiceTable()
	b.next.services[key] = sc
	b.fresh[key] = true
	b.dirty[key] = true
	b.reindexServiceVIPs(key, old, sc)
	b.changed = true
	return nil
}

// RemoveService removes the service "namespace/hostname". Endpoints that
// workloads still declare for it become staged again. It reports whether
// the service existed.
func (b *Batch) RemoveService(key string) bool {
	b.checkOpen()
	old := b.next.services[key]
	if old == nil {
		return false
	}
	b.ownServiceTable()
	delete(b.next.services, key)
	delete(b.fresh, key)
	b.dirty[key] = true
	b.reindexServiceVIPs(key, old, nil)
	b.changed = true
	return true
}

// InsertPolicy adds p, replacing any policy with the same key and moving its
// index entry if its scope or namespace changed (TESTPLAN S3). It returns an
// error, and changes nothing, if p is invalid. The store keeps p itself: the
// caller must not modify it afterwards.
func (b *Batch) InsertPolicy(p *rbac.Policy) error {
	b.checkOpen()
	if err := validatePolicy(p); err != nil {
		return err
	}
	key := p.Key()
	old := b.next.policies[key]
	if !b.ownPolicies {
		b.next.policies = maps.Clone(b.next.policies)
		b.ownPolicies = true
	}
	b.next.policies[key] = p
	if old != p { // the same pointer again changes no index
		if old != nil {
			b.unindexPolicy(old)
		}
		b.indexPolicy(p)
	}
	b.chPolicies[key] = true
	b.changed = true
	return nil
}

// RemovePolicy removes the policy "namespace/name" and reports whether it
// existed.
func (b *Batch) RemovePolicy(key string) bool {
	b.checkOpen()
	old := b.next.policies[key]
	if old == nil {
		return false
	}
	if !b.ownPolicies {
		b.next.policies = maps.Clone(b.next.policies)
		b.ownPolicies = true
	}
	delete(b.next.policies, key)
	b.unindexPolicy(old)
	b.chPolicies[key] = true
	b.changed = true
	return true
}

// Remove applies an xDS removal by resource name: it tries name as a
// workload uid, then as a service key, then as a policy key (SPEC §5.3), and
// reports whether anything was removed.
func (b *Batch) Remove(name string) bool {
	return b.RemoveWorkload(name) || b.RemoveService(name) || b.RemovePolicy(name)
}

// Snapshot returns the state as changed so far in this batch, for reading
// only (for example to look up the service a workload refers to). It is
// valid only until the next change to the batch; endpoints (of services
// and staged) changed in this batch are brought up to date only when the
// batch commits.
// It brings the policy indexes up to date, which copies each policy list
// changed since the last call: calling it after every policy change makes a
// batch quadratic again.
func (b *Batch) Snapshot() *Snapshot {
	b.checkOpen()
	b.flushPolicyIndex()
	return b.next
}

// --- workloads ---

// ownWorkloadTable gives the batch its own uid table and records.
func (b *Batch) ownWorkloadTable() {
	if !b.ownWorkloads {
		b.next.byUID = b.next.byUID.Clone(b.reserve)
		recs := make([]string, len(b.next.recs), len(b.next.recs)+b.reserve)
		copy(recs, b.next.recs)
		b.next.recs = recs
		b.ownWorkloads = true
	}
}

// takeSlot returns a free slot for a new workload: a freed one, or a new
// one at the end. The batch owns the workload table.
func (b *Batch) takeSlot() int32 {
	if n := len(b.next.free); n > 0 {
		b.ownFreeList()
		slot := b.next.free[n-1]
		b.next.free = b.next.free[:n-1]
		return slot
	}
	b.next.recs = append(b.next.recs, "")
	return int32(len(b.next.recs) - 1)
}

// ownFreeList gives the batch its own free list.
func (b *Batch) ownFreeList() {
	if !b.ownFree {
		b.next.free = slices.Clone(b.next.free)
		b.ownFree = true
	}
}

// ipRankOf orders workloads sharing an IP (SPEC §3.4): lower is preferred.
func ipRankOf(pod, hbone bool) int {
	switch {
	case pod && hbone:
		return 0
	case pod:
		return 1
	case hbone:
		return 2
	}
	return 3
}

// compareByIPPreference orders the slots of workloads sharing an IP by
// preference, then uid.
func (b *Batch) compareByIPPreference(x, y int32) int {
	rx, ry := b.next.recs[x], b.next.recs[y]
	if c := cmp.Compare(recIPRank(rx), recIPRank(ry)); c != 0 {
		return c
	}
	return cmp.Compare(recUIDOf(rx), recUIDOf(ry))
}

// compareByUID orders slots by their workloads' uids.
func (b *Batch) compareByUID(x, y int32) int {
	return cmp.Compare(recUIDOf(b.next.recs[x]), recUIDOf(b.next.recs[y]))
}

// ipIndexed reports whether w is indexed by IP (HostNetwork workloads are not).
func ipIndexed(w *Workload) bool { return w != nil && w.NetworkMode != NetworkHost }

// reindexWorkloadIPs replaces old with w (either may be nil), the
// workload at slot, in the address index.
func (b *Batch) reindexWorkloadIPs(slot int32, old, w *Workload) {
	var buf [4]ipSlot // room for the usual few addresses, off the heap
	keys := buf[:0]
	if ipIndexed(old) {
		for _, a := range old.Addresses {
			keys = append(keys, b.ipSlotFor(old.Network, a))
		}
	}
	var wKeys []ipSlot
	if ipIndexed(w) {
		for _, a := range w.Addresses {
			keys = append(keys, b.ipSlotFor(w.Network, a))
		}
		wKeys = keys[len(keys)-len(w.Addresses):]
	}
	if len(keys) == 0 {
		return
	}
	if !b.ownByIP {
		b.next.byIP.one = cloneFor(b.next.byIP.one, b.reserve)
		b.ownByIP = true
	}
	for i, k := range keys {
		if slices.Contains(keys[:i], k) {
			continue
		}
		b.reindexIP(k, slot, slices.Contains(wKeys, k))
	}
}

// ipSlotFor returns byIP's key for address a on network, numbering the
// network if it is new.
func (b *Batch) ipSlotFor(network string, a netip.Addr) ipSlot {
	if network == "" {
		return ipSlot{0, a.Unmap().As16()}
	}
	id, ok := b.next.netIDs[network]
	if !ok {
		if !b.ownNetIDs {
			b.next.netIDs = maps.Clone(b.next.netIDs)
			b.ownNetIDs = true
		}
		id = uint32(len(b.next.netIDs)) + 1 // 0 is the default network, ""
		b.next.netIDs[network] = id
	}
	return ipSlot{id, a.Unmap().As16()}
}

// reindexIP rebuilds the list at k without slot, and with it if has (the
// workload now at slot has k).
func (b *Batch) reindexIP(k ipSlot, slot int32, has bool) {
	l := without(b.next.byIP.slots(k, b.list[:0]), slot)
	if has {
		l = append(l, slot)
	}
	slices.SortFunc(l, b.compareByIPPreference)
	b.next.byIP.set(k, l, &b.ownByIPMore)
	b.list = l
}

// without removes slot from l, in place.
func without(l []int32, slot int32) []int32 {
	return slices.DeleteFunc(l, func(x int32) bool { return x == slot })
}

// reindexWorkloadName replaces old with w (either may be nil), the
// workload at slot, in the name index.
func (b *Batch) reindexWorkloadName(slot int32, old, w *Workload) {
	if !b.ownByName {
		b.next.byName.one = cloneFor(b.next.byName.one, b.reserve)
		b.ownByName = true
	}
	if old != nil {
		h := nameHash(old.Name)
		l := without(b.next.byName.slots(h, b.list[:0]), slot)
		b.next.byName.set(h, l, &b.ownByNameMore)
		b.list = l
	}
	if w != nil {
		h := nameHash(w.Name)
		l := append(without(b.next.byName.slots(h, b.list[:0]), slot), slot)
		slices.SortFunc(l, b.compareByUID)
		b.next.byName.set(h, l, &b.ownByNameMore)
		b.list = l
	}
}

// slotIndex is a workload index whose table holds no pointer (byIP,
// byName), so a garbage collection skips it: one maps a key to the slot of
// its one workload, or to -1 when several have it; their slots, in the
// index's order, are in more. Like the rest of a snapshot, it is never
// modified once published.
type slotIndex[K comparable] struct {
	one  map[K]int32
	more map[K][]int32
}

func newSlotIndex[K comparable]() slotIndex[K] {
	return slotIndex[K]{one: map[K]int32{}, more: map[K][]int32{}}
}

// first returns the slot of the first workload listed at k, or -1.
func (x *slotIndex[K]) first(k K) int32 {
	slot, ok := x.one[k]
	switch {
	case !ok:
		return -1
	case slot < 0:
		return x.more[k][0]
	}
	return slot
}

// slots appends the slots listed at k, in order, to dst.
func (x *slotIndex[K]) slots(k K, dst []int32) []int32 {
	slot, ok := x.one[k]
	switch {
	case !ok:
		return dst
	case slot < 0:
		return append(dst, x.more[k]...)
	}
	return append(dst, slot)
}

// set makes l, in the index's order, its list at k (l may be reused
// afterwards). The batch owns x.one; ownMore is its flag for x.more, which
// set copies before its first change.
func (x *slotIndex[K]) set(k K, l []int32, ownMore *bool) {
	ownedMore := func() map[K][]int32 {
		if !*ownMore {
			x.more = maps.Clone(x.more)
			*ownMore = true
		}
		return x.more
	}
	if prev, ok := x.one[k]; ok && prev < 0 {
		delete(ownedMore(), k)
	}
	switch len(l) {
	case 0:
		delete(x.one, k)
	case 1:
		x.one[k] = l[0]
	default:
		x.one[k] = -1
		ownedMore()[k] = slices.Clone(l)
	}
}

// --- endpoints ---

// updateEndpoints replaces old's endpoints with w's (either may be nil);
// uid is theirs, as the store keeps it.
func (b *Batch) updateEndpoints(old, w *Workload, uid string) {
	if old != nil {
		for key := range old.Services {
			if w != nil {
				if _, ok := w.Services[key]; ok {
					continue
				}
			}
			b.deleteMember(key, uid)
		}
	}
	if w == nil {
		return
	}
	for key, ports := range w.Services {
		ep := Endpoint{WorkloadUID: uid, Ports: ports, Status: w.Status}
		if cur, ok := b.member(key, uid); ok && cur.Status == ep.Status && maps.Equal(cur.Ports, ep.Ports) {
			continue
		}
		b.memberMap(key)[uid] = ep
		b.dirty[key] = true
	}
}

// member returns workload uid's endpoint among key's members, as changed so
// far in this batch.
func (b *Batch) member(key, uid string) (Endpoint, bool) {
	if m, ok := b.thawed[key]; ok {
		ep, ok := m[uid]
		return ep, ok
	}
	return b.next.members[key].Get(uid)
}

// memberMap returns key's members as a map that this batch may modify.
func (b *Batch) memberMap(key string) map[string]Endpoint {
	m, ok := b.thawed[key]
	if !ok {
		m = b.next.members[key].Map()
		b.thawed[key] = m
	}
	return m
}

func (b *Batch) deleteMember(key, uid string) {
	if _, ok := b.member(key, uid); !ok {
		return
	}
	delete(b.memberMap(key), uid)
	b.dirty[key] = true
}

// freezeMembers stores the members this batch changed.
func (b *Batch) freezeMembers() {
	if len(b.thawed) == 0 {
		return
	}
	if !b.ownMembers {
		b.next.members = maps.Clone(b.next.members)
		b.ownMembers = true
	}
	for key, m := range b.thawed {
		if len(m) == 0 {
			delete(b.next.members, key)
		} else {
			b.next.members[key] = freezeEndpoints(m)
		}
	}
	clear(b.thawed)
}

// --- services ---

func (b *Batch) ownServiceTable() {
	if !b.ownServices {
		b.next.services = maps.Clone(b.next.services)
		b.ownServices = true
	}
}

// refreshService brings services[key].Endpoints and the hostname index up to
// date at commit.
func (b *Batch) refreshService(key string) {
	svc := b.next.services[key]
	if svc != nil {
		if !b.fresh[key] {
			c := *svc
			svc = &c
		}
		svc.Endpoints = admittedEndpoints(svc, b.next.members[key])
		b.ownServiceTable()
		b.next.services[key] = svc
	}
	b.reindexHostname(key, svc)
}

// admittedEndpoints returns the endpoints svc stores: eps itself if every
// one is admitted, else the admitted ones.
func admittedEndpoints(svc *Service, eps EndpointSet) EndpointSet {
	for _, ep := range eps.All() {
		if !svc.admits(ep.Status) {
			return eps.filter(func(ep Endpoint) bool { return svc.admits(ep.Status) })
		}
	}
	return eps
}

// reindexHostname replaces the entry for key in the hostname index with svc
// (nil removes it).
func (b *Batch) reindexHostname(key string, svc *Service) {
	hostname := svc.hostnameOr(key)
	cur := b.next.byHostname[hostname]
	if svc == nil && !slices.ContainsFunc(cur, func(x *Service) bool { return x.Key() == key }) {
		return
	}
	l := make([]*Service, 0, len(cur)+1)
	for _, x := range cur {
		if x.Key() != key {
			l = append(l, x)
		}
	}
	if svc != nil {
		l = append(l, svc)
	}
	if !b.ownByHostname {
		b.next.byHostname = maps.Clone(b.next.byHostname)
		b.ownByHostname = true
	}
	if len(l) == 0 {
		delete(b.next.byHostname, hostname)
		return
	}
	slices.SortFunc(l, func(a, b *Service) int { return cmp.Compare(a.Namespace, b.Namespace) })
	b.next.byHostname[hostname] = l
}

// hostnameOr returns s.Hostname, or the hostname part of key if s is nil.
func (s *Service) hostnameOr(key string) string {
	if s != nil {
		return s.Hostname
	}
	_, h, _ := strings.Cut(key, "/")
	return h
}

// exactVIPs returns the addresses at which s is indexed exactly: its VIPs
// and any full-length CIDR VIPs.
func exactVIPs(s *Service) []ipKey {
	if s == nil {
		return nil
	}
	var ks []ipKey
	for _, v := range s.VIPs {
		ks = append(ks, ipKey{v.Network, v.Address})
	}
	for _, p := range s.CIDRVIPs {
		if p.Prefix.IsSingleIP() {
			ks = append(ks, ipKey{p.Network, p.Prefix.Addr()})
		}
	}
	return ks
}

func (b *Batch) reindexServiceVIPs(key string, old, s *Service) {
	oldKeys, newKeys := exactVIPs(old), exactVIPs(s)
	if len(oldKeys)+len(newKeys) > 0 && !b.ownByVIP {
		b.next.byVIP = maps.Clone(b.next.byVIP)
		b.ownByVIP = true
	}
	for _, k := range oldKeys {
		if !slices.Contains(newKeys, k) {
			l := slices.DeleteFunc(slices.Clone(b.next.byVIP[k]), func(x string) bool { return x == key })
			if len(l) == 0 {
				delete(b.next.byVIP, k)
			} else {
				b.next.byVIP[k] = l
			}
		}
	}
	for i, k := range newKeys {
		// A service keeps its position (first seen) at a VIP it already had.
		if slices.Contains(newKeys[:i], k) || slices.Contains(b.next.byVIP[k], key) {
			continue
		}
		cur := b.next.byVIP[k]
		l := make([]string, len(cur), len(cur)+1)
		copy(l, cur)
		b.next.byVIP[k] = append(l, key)
	}
	b.reindexCIDRs(key, old, s)
}

func (b *Batch) reindexCIDRs(key string, old, s *Service) {
	hasCIDR := func(x *Service) bool {
		if x == nil {
			return false
		}
		for _, p := range x.CIDRVIPs {
			if !p.Prefix.IsSingleIP() {
				return true
			}
		}
		return false
	}
	if !hasCIDR(old) && !hasCIDR(s) {
		return
	}
	// Keep the position of entries that stay (first seen), drop removed
	// ones, append new ones.
	var want []cidrEntry
	if s != nil {
		for _, p := range s.CIDRVIPs {
			if !p.Prefix.IsSingleIP() {
				want = append(want, cidrEntry{p.Network, p.Prefix, key})
			}
		}
	}
	l := make([]cidrEntry, 0, len(b.next.cidrs)+len(want))
	for _, e := range b.next.cidrs {
		if e.key != key {
			l = append(l, e)
		} else if i := slices.Index(want, e); i >= 0 {
			l = append(l, e)
			want = slices.Delete(want, i, i+1)
		}
	}
	b.next.cidrs = append(l, want...)
}

// --- policies ---

// indexPolicy records that p entered the policies table.
func (b *Batch) indexPolicy(p *rbac.Policy) {
	delete(b.dropped, p)
	switch p.Scope {
	case rbac.Namespace:
		b.nsAdded[p.Namespace] = append(b.nsAdded[p.Namespace], p)
	case rbac.Global:
		b.globalDirty = true
		b.globalAdded = append(b.globalAdded, p)
	}
}

// unindexPolicy records that p left the policies table.
func (b *Batch) unindexPolicy(p *rbac.Policy) {
	b.dropped[p] = true
	switch p.Scope {
	case rbac.Namespace:
		if _, ok := b.nsAdded[p.Namespace]; !ok {
			b.nsAdded[p.Namespace] = nil
		}
	case rbac.Global:
		b.globalDirty = true
	}
}

// flushPolicyIndex rebuilds each policy list changed since the last flush,
// once: O(m + a log a) for a list of m policies with a added.
func (b *Batch) flushPolicyIndex() {
	if len(b.nsAdded) > 0 {
		b.ownNSPolicyTable()
	}
	for ns, added := range b.nsAdded {
		if set := b.rebuildPolicySet(b.next.nsPolicies[ns], added); set != nil {
			b.next.nsPolicies[ns] = set
		} else {
			delete(b.next.nsPolicies, ns)
		}
	}
	clear(b.nsAdded)
	if b.globalDirty {
		b.next.global = b.rebuildPolicySet(b.next.global, b.globalAdded)
		b.globalDirty, b.globalAdded = false, nil
	}
}

// rebuildPolicySet returns the Set of the policies of cur and added that
// are still in the policies table, or nil if there are none. It returns
// cur itself when the list is unchanged (policies removed and put back),
// and otherwise builds the Set's index, once per list per batch: O(size of
// the policies added) to analyze them, O(m) for the m policies of the list
// that cur had analyzed already.
func (b *Batch) rebuildPolicySet(cur *rbac.Set, added []*rbac.Policy) *rbac.Set {
	l := b.rebuildPolicyList(cur.Policies(), added)
	switch {
	case len(l) == 0:
		return nil
	case slices.Equal(l, cur.Policies()):
		return cur
	}
	return rbac.NewSetFrom(cur, l)
}

// rebuildPolicyList returns, in a new slice sorted by key (nil if empty),
// the policies of cur and added that are still in the policies table. cur
// is sorted and is not modified.
func (b *Batch) rebuildPolicyList(cur, added []*rbac.Policy) []*rbac.Policy {
	kept := make([]*rbac.Policy, 0, len(cur))
	for _, p := range cur {
		if !b.dropped[p] {
			kept = append(kept, p)
		}
	}
	var fresh []*rbac.Policy
	for _, p := range added {
		if !b.dropped[p] {
			fresh = append(fresh, p)
		}
	}
	// Two live entries with one key are the same policy: the table holds
	// one per key.
	slices.SortFunc(fresh, comparePolicies)
	fresh = slices.Compact(fresh)
	out := mergePolicies(kept, fresh)
	if len(out) == 0 {
		return nil
	}
	return out
}

func (b *Batch) ownNSPolicyTable() {
	if !b.ownNSPolicies {
		b.next.nsPolicies = maps.Clone(b.next.nsPolicies)
		b.ownNSPolicies = true
	}
}

// mergePolicies merges two lists sorted by key into a new one, keeping one
// of two entries with the same key (the same policy, see rebuildPolicyList).
func mergePolicies(x, y []*rbac.Policy) []*rbac.Policy {
	if len(y) == 0 {
		return x
	}
	out := make([]*rbac.Policy, 0, len(x)+len(y))
	for len(x) > 0 && len(y) > 0 {
		switch c := comparePolicies(x[0], y[0]); {
		case c < 0:
			out, x = append(out, x[0]), x[1:]
		case c > 0:
			out, y = append(out, y[0]), y[1:]
		default:
			out, x, y = append(out, x[0]), x[1:], y[1:]
		}
	}
	out = append(out, x...)
	return append(out, y...)
}
