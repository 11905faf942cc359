package xds

import (
	"net/netip"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/state"
)

// The fast workload decoder reads an istio.workload.Address straight from
// its wire bytes into a state.Workload, without the intermediate proto
// messages (a Workload, its oneof wrapper, a map entry, a PortList and a
// Port per service, a copy of every string and address) that proto.Unmarshal
// builds and workloadFromProto throws away: those were about nine tenths of
// the objects a push allocated, and with them the garbage collections that
// stalled the data path during a large push.
//
// It handles the common shape of a workload, and for anything else (a
// service, an extension, a message field repeated where the proto
// library would merge the occurrences, a wire type that does not match
// the field) and for anything invalid it reports false, so that the caller
// decodes the resource with proto.Unmarshal and converts it with
// workloadFromProto: every error, and every unusual input, goes through
// the one general path, and what the fast path accepts equals what that
// path returns (FuzzFastWorkloadDecode checks it).
//
// Values that workloads of one push have in common are shared through the
// decodeCache: strings (as by the interner), and, keyed by their exact wire
// bytes, the services map with its port maps, gateways and policy lists.
// Equal wire bytes decode to equal values, and the store never modifies
// what it is given, so sharing them is invisible to readers.

// decodeCache holds what the resources of one push share. If reuse is set,
// every workload is decoded into scratch, so a decoded workload is valid
// only until the next is decoded (the store keeps a record of its own).
type decodeCache struct {
	reuse    bool
	scratch  workloadAlloc
	in       interner
	services map[string]map[string]state.PortMap // wire bytes of the services entries →
	gateways map[string]*state.GatewayAddress    // wire bytes of a GatewayAddress →
	policies map[string][]string                 // wire bytes of the authorization_policies →
}

func newDecodeCache() *decodeCache {
	return &decodeCache{
		in:       newInterner(),
		services: map[string]map[string]state.PortMap{},
		gateways: map[string]*state.GatewayAddress{},
		policies: map[string][]string{},
	}
}

// Field numbers of workload.proto that the fast decoder reads.
const (
	addrWorkload = 1

	wName              = 1
	wNamespace         = 2
	wAddresses         = 3
	wNetwork           = 4
	wTunnelProtocol    = 5
	wTrustDomain       = 6
	wServiceAccount    = 7
	wWaypoint          = 8
	wNode              = 9
	wCanonicalName     = 10
	wCanonicalRevision = 11
	wWorkloadType      = 12
	wWorkloadName      = 13
	wNativeTunnel      = 14
	wAuthzPolicies     = 16
	wStatus            = 17
	wClusterID         = 18
	wNetworkGateway    = 19
	wUID               = 20
	wHostname          = 21
	wServices          = 22
	wAppTunnel         = 23
	wLocality          = 24
	wNetworkMode       = 25
	wExtensions        = 26
	wCapacity          = 27

	// Address.service, PortList.ports, Port.{service,target}_port and
	// Locality's fields.
	addrService     = 2
	plPorts         = 1
	portService     = 1
	portTarget      = 2
	portAppProtocol = 3
)

// rawWorkload is what the decoder collects before converting: the last
// occurrence of each scalar field (proto3 semantics) as its wire bytes, so
// that no string is allocated for a value that a later one replaces, and
// where the repeated fields' records lie.
type rawWorkload struct {
	str          [wCapacity + 1][]byte // string fields by number
	enum         [wCapacity + 1]int32  // enum fields by number
	nativeTunnel bool
	addrs        [4][]byte // the addresses (4 or 16 bytes each), in order
	naddrs       int

	waypoint, gateway, appTun          []byte // message bytes
	hasWaypoint, hasGateway, hasAppTun bool
	locality                           [3][]byte
	hasLocality                        bool
	capacity                           uint32
	hasCapacity                        bool

	// The byte ranges, within the Workload message, of the records of the
	// services and authorization_policies fields, and whether other
	// fields come between them (split: the value is then not shared).
	servicesStart, servicesEnd   int
	policiesStart, policiesEnd   int
	npolicies                    int
	servicesSplit, policiesSplit bool
}

// workload decodes the Address in b, whose resource name is name, if the
// fast path handles it: see the comment at the top of this file. The
// workload's uid must equal name (the caller rejects the resource
// otherwise, through the general path), and shares name's bytes.
func (c *decodeCache) workload(b []byte, name string) (*state.Workload, bool) {
	var wb []byte
	seen := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch num {
		case addrWorkload:
			if typ != protowire.BytesType || seen {
				return nil, false
			}
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			wb, seen, b = v, true, b[m:]
			continue
		case addrService:
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, false
		}
		b = b[m:]
	}
	if !seen {
		return nil, false
	}
	var r rawWorkload
	if !r.parse(wb) {
		return nil, false
	}
	return c.convert(&r, wb, name)
}

// parse reads the fields of a Workload message.
func (r *rawWorkload) parse(b []byte) bool {
	all := b
	for len(b) > 0 {
		start := len(all) - len(b)
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch num {
		case wName, wNamespace, wNetwork, wTrustDomain, wServiceAccount, wNode,
			wCanonicalName, wCanonicalRevision, wWorkloadName, wClusterID, wUID, wHostname:
			v, ok := consumeString(&b, typ)
			if !ok {
				return false
			}
			r.str[num] = v
		case wTunnelProtocol, wWorkloadType, wStatus, wNetworkMode:
			v, ok := consumeVarint(&b, typ)
			if !ok {
				return false
			}
			r.enum[num] = int32(v)
		case wNativeTunnel:
			v, ok := consumeVarint(&b, typ)
			if !ok {
				return false
			}
			r.nativeTunnel = v != 0
		case wAddresses:
			v, ok := consumeBytes(&b, typ)
			if !ok || (len(v) != 4 && len(v) != 16) || r.naddrs == len(r.addrs) {
				return false
			}
			r.addrs[r.naddrs] = v
			r.naddrs++
		case wWaypoint, wNetworkGateway, wAppTunnel, wLocality, wCapacity:
			v, ok := consumeBytes(&b, typ)
			if !ok || !r.message(num, v) {
				return false
			}
		case wAuthzPolicies:
			if _, ok := consumeString(&b, typ); !ok {
				return false
			}
			r.npolicies++
			r.policiesSplit = r.policiesSplit || !extend(&r.policiesStart, &r.policiesEnd, start, len(all)-len(b))
		case wServices:
			v, ok := consumeBytes(&b, typ)
			if !ok || !validServiceEntry(v) {
				return false
			}
			r.servicesSplit = r.servicesSplit || !extend(&r.servicesStart, &r.servicesEnd, start, len(all)-len(b))
		case wExtensions:
			return false
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return false
			}
			b = b[m:]
		}
	}
	return true
}

// message records a singular message field; a second occurrence (which
// proto.Unmarshal would merge into the first) is left to the general path.
func (r *rawWorkload) message(num protowire.Number, v []byte) bool {
	switch num {
	case wWaypoint:
		if r.hasWaypoint {
			return false
		}
		r.waypoint, r.hasWaypoint = v, true
	case wNetworkGateway:
		if r.hasGateway {
			return false
		}
		r.gateway, r.hasGateway = v, true
	case wAppTunnel:
		if r.hasAppTun {
			return false
		}
		r.appTun, r.hasAppTun = v, true
	case wLocality:
		if r.hasLocality {
			return false
		}
		r.hasLocality = true
		return parseLocality(v, &r.locality)
	case wCapacity:
		if r.hasCapacity {
			return false
		}
		r.hasCapacity = true
		for len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			if n < 0 {
				return false
			}
			v = v[n:]
			if num == 1 {
				x, ok := consumeVarint(&v, typ)
				if !ok {
					return false
				}
				r.capacity = uint32(x)
				continue
			}
			if !skip(&v, num, typ) {
				return false
			}
		}
	}
	return true
}

// extend grows the byte range [*start, *end) of a repeated field's records
// by the record at [from, to), reporting false if the record does not
// follow the range directly.
func extend(start, end *int, from, to int) bool {
	if *end == 0 {
		*start, *end = from, to
		return true
	}
	if *end != from {
		return false
	}
	*end = to
	return true
}

func parseLocality(b []byte, out *[3][]byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num >= 1 && num <= 3 {
			v, ok := consumeString(&b, typ)
			if !ok {
				return false
			}
			out[num-1] = v
			continue
		}
		if !skip(&b, num, typ) {
			return false
		}
	}
	return true
}

// validServiceEntry checks the shape of one services map entry: a string
// key, and at most one PortList value whose ports decode.
func validServiceEntry(b []byte) bool {
	_, _, ok := parseServiceEntry(b)
	return ok
}

// parseServiceEntry returns the key and the PortList bytes (nil if absent)
// of a services map entry. A key repeated within the entry keeps the last
// (as proto does); a repeated value, which proto would merge, and any
// malformed port are refused.
func parseServiceEntry(b []byte) (key, value []byte, ok bool) {
	hasValue := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		b = b[n:]
		switch num {
		case 1:
			v, ok := consumeString(&b, typ)
			if !ok {
				return nil, nil, false
			}
			key = v
		case 2:
			v, ok := consumeBytes(&b, typ)
			if !ok || hasValue || !validPortList(v) {
				return nil, nil, false
			}
			value, hasValue = v, true
		default:
			if !skip(&b, num, typ) {
				return nil, nil, false
			}
		}
	}
	return key, value, true
}

func validPortList(b []byte) bool {
	return forEachPort(b, func(sp, tp uint32) {})
}

// forEachPort calls fn with the service and target port of each Port of a
// PortList, in order, and reports whether the list decodes.
func forEachPort(b []byte, fn func(sp, tp uint32)) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num != plPorts {
			if !skip(&b, num, typ) {
				return false
			}
			continue
		}
		p, ok := consumeBytes(&b, typ)
		if !ok {
			return false
		}
		var sp, tp uint32
		for len(p) > 0 {
			num, typ, n := protowire.ConsumeTag(p)
			if n < 0 {
				return false
			}
			p = p[n:]
			switch num {
			case portService, portTarget, portAppProtocol:
				v, ok := consumeVarint(&p, typ)
				if !ok {
					return false
				}
				switch num {
				case portService:
					sp = uint32(v)
				case portTarget:
					tp = uint32(v)
				}
			default:
				if !skip(&p, num, typ) {
					return false
				}
			}
		}
		fn(sp, tp)
	}
	return true
}

// convert builds the workload from r, as workloadFromProto would from the
// decoded message. wb is the Workload message's bytes.
func (c *decodeCache) convert(r *rawWorkload, wb []byte, name string) (*state.Workload, bool) {
	in := c.in
	uid := r.str[wUID]
	if len(uid) == 0 || string(uid) != name {
		return nil, false
	}
	// One allocation for the workload and, in the usual case of one
	// address, its address: one object less per workload for the
	// collector to mark.
	wa := &c.scratch
	if !c.reuse {
		wa = new(workloadAlloc)
	}
	w := &wa.w
	*w = state.Workload{
		UID:               name,
		Namespace:         in.bytes(r.str[wNamespace]),
		Network:           in.bytes(r.str[wNetwork]),
		TrustDomain:       orDefault(in.bytes(r.str[wTrustDomain]), xdsDefaultTrustDomain),
		ServiceAccount:    orDefault(in.bytes(r.str[wServiceAccount]), xdsDefaultServiceAccount),
		Node:              in.bytes(r.str[wNode]),
		CanonicalName:     in.bytes(r.str[wCanonicalName]),
		CanonicalRevision: in.bytes(r.str[wCanonicalRevision]),
		WorkloadName:      in.bytes(r.str[wWorkloadName]),
		NativeTunnel:      r.nativeTunnel,
		ClusterID:         orDefault(in.bytes(r.str[wClusterID]), xdsDefaultClusterID),
		Capacity:          1,
	}
	w.Name = suffixOr(name, r.str[wName])
	if h := r.str[wHostname]; len(h) > 0 {
		w.Hostname = string(h)
	}
	if r.hasCapacity {
		w.Capacity = r.capacity
	}
	if r.hasLocality {
		w.Locality = state.Locality{Region: in.bytes(r.locality[0]), Zone: in.bytes(r.locality[1]), Subzone: in.bytes(r.locality[2])}
	}
	if err := workloadEnums(workloadapi.TunnelProtocol(r.enum[wTunnelProtocol]), workloadapi.WorkloadType(r.enum[wWorkloadType]),
		workloadapi.WorkloadStatus(r.enum[wStatus]), workloadapi.NetworkMode(r.enum[wNetworkMode]), w); err != nil {
		return nil, false
	}
	switch {
	case r.naddrs == 1:
		w.Addresses = wa.addr[:1:1]
	case r.naddrs > 1:
		w.Addresses = make([]netip.Addr, r.naddrs)
	}
	for i, a := range r.addrs[:r.naddrs] {
		ip, err := pbAddr(a)
		if err != nil {
			return nil, false
		}
		w.Addresses[i] = ip
	}
	var ok bool
	if r.hasWaypoint {
		if w.Waypoint, ok = c.gateway(r.waypoint); !ok {
			return nil, false
		}
	}
	if r.hasGateway {
		if w.NetworkGateway, ok = c.gateway(r.gateway); !ok {
			return nil, false
		}
	}
	if r.hasAppTun {
		var t workloadapi.ApplicationTunnel
		if proto.Unmarshal(r.appTun, &t) != nil {
			return nil, false
		}
		var err error
		if w.ApplicationTunnel, err = pbAppTunnel(&t); err != nil {
			return nil, false
		}
	}
	if r.npolicies > 0 {
		if w.AuthorizationPolicies, ok = c.policyList(wb, r); !ok {
			return nil, false
		}
	}
	if r.servicesEnd > 0 {
		if w.Services, ok = c.serviceMap(wb, r); !ok {
			return nil, false
		}
	}
	return w, true
}

// workloadAlloc is a decoded workload with room for one address beside it.
type workloadAlloc struct {
	w    state.Workload
	addr [1]netip.Addr
}

// suffixOr returns s as a string, sharing uid's bytes when uid ends with s
// (a pod's uid ends with its name).
func suffixOr(uid string, s []byte) string {
	if len(s) == 0 {
		return ""
	}
	if len(s) <= len(uid) && uid[len(uid)-len(s):] == string(s) {
		return uid[len(uid)-len(s):]
	}
	return string(s)
}

// gateway converts a GatewayAddress message, sharing one value per
// distinct encoding.
func (c *decodeCache) gateway(b []byte) (*state.GatewayAddress, bool) {
	if g, ok := c.gateways[string(b)]; ok {
		return g, true
	}
	var p workloadapi.GatewayAddress
	if proto.Unmarshal(b, &p) != nil {
		return nil, false
	}
	g, err := pbGateway(&p)
	if err != nil {
		return nil, false
	}
	c.gateways[string(b)] = g
	return g, true
}

// policyList returns the authorization_policies of the workload wb, shared
// with other workloads whose list is encoded the same way when its records
// are contiguous.
func (c *decodeCache) policyList(wb []byte, r *rawWorkload) ([]string, bool) {
	var key []byte
	if !r.policiesSplit {
		key = wb[r.policiesStart:r.policiesEnd]
		if l, ok := c.policies[string(key)]; ok {
			return l, true
		}
	}
	l := make([]string, 0, r.npolicies)
	b := wb
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		if num == wAuthzPolicies {
			v, _ := consumeString(&b, typ)
			l = append(l, c.in.bytes(v))
			continue
		}
		skip(&b, num, typ)
	}
	if key != nil {
		c.policies[string(key)] = l
	}
	return l, true
}

// serviceMap returns the services map of the workload wb, as
// pbWorkloadServices converts it, shared with other workloads whose
// entries are encoded the same way when they are contiguous.
func (c *decodeCache) serviceMap(wb []byte, r *rawWorkload) (map[string]state.PortMap, bool) {
	var key []byte
	if !r.servicesSplit {
		key = wb[r.servicesStart:r.servicesEnd]
		if m, ok := c.services[string(key)]; ok {
			return m, true
		}
	}
	m := map[string]state.PortMap{}
	b := wb
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		if num != wServices {
			skip(&b, num, typ)
			continue
		}
		e, _ := consumeBytes(&b, typ)
		k, v, _ := parseServiceEntry(e)
		if !validServiceKey(k) {
			return nil, false
		}
		pm, ok := portMap(v)
		if !ok {
			return nil, false
		}
		m[c.in.bytes(k)] = pm
	}
	if key != nil {
		c.services[string(key)] = m
	}
	return m, true
}

// validServiceKey reports whether k is "namespace/hostname", both parts
// non-empty, as pbWorkloadServices requires.
func validServiceKey(k []byte) bool {
	for i, ch := range k {
		if ch == '/' {
			return i > 0 && i < len(k)-1
		}
	}
	return false
}

// portMap converts a PortList as pbPortMap does: nil for no ports, a
// repeated service port keeps the last target.
func portMap(b []byte) (state.PortMap, bool) {
	n := 0
	forEachPort(b, func(sp, tp uint32) { n++ })
	if n == 0 {
		return nil, true
	}
	pm := make(state.PortMap, n)
	ok := true
	forEachPort(b, func(sp, tp uint32) {
		if sp > 0xffff || tp > 0xffff {
			ok = false
			return
		}
		pm[uint16(sp)] = uint16(tp)
	})
	return pm, ok
}

// consumeString reads a length-delimited field that must be valid UTF-8
// (proto3 strings are checked by proto.Unmarshal too).
func consumeString(b *[]byte, typ protowire.Type) ([]byte, bool) {
	v, ok := consumeBytes(b, typ)
	if !ok || !utf8.Valid(v) {
		return nil, false
	}
	return v, true
}

func consumeBytes(b *[]byte, typ protowire.Type) ([]byte, bool) {
	if typ != protowire.BytesType {
		return nil, false
	}
	v, n := protowire.ConsumeBytes(*b)
	if n < 0 {
		return nil, false
	}
	*b = (*b)[n:]
	return v, true
}

func consumeVarint(b *[]byte, typ protowire.Type) (uint64, bool) {
	if typ != protowire.VarintType {
		return 0, false
	}
	v, n := protowire.ConsumeVarint(*b)
	if n < 0 {
		return 0, false
	}
	*b = (*b)[n:]
	return v, true
}

// skip consumes the value of a field the decoder does not read.
func skip(b *[]byte, num protowire.Number, typ protowire.Type) bool {
	n := protowire.ConsumeFieldValue(num, typ, *b)
	if n < 0 {
		return false
	}
	*b = (*b)[n:]
	return true
}
