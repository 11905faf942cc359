package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// errNoAnswer is what fakeDemander returns for a key it has no answer for,
// as a demander does when the control plane sends nothing in time.
var errNoAnswer = errors.New("no answer in time")

// fakeDemander is a state.Demander standing in for istiod. It records every
// key it is asked for, in order; for a key in answers it fills the store
// with that answer before returning, and any other key fails with
// errNoAnswer.
type fakeDemander struct {
	t       *testing.T
	store   *state.Store
	ctx     context.Context // the context each demand must carry
	answers map[string]func(b *state.Batch) []error
	asked   []string
}

func (d *fakeDemander) Demand(ctx context.Context, key string) error {
	d.asked = append(d.asked, key)
	if ctx != d.ctx {
		d.t.Errorf("Demand(%q) got a context other than the proxy's lifetime", key)
	}
	fill, ok := d.answers[key]
	if !ok {
		return errNoAnswer
	}
	var errs []error
	d.store.Update(func(b *state.Batch) { errs = fill(b) })
	if err := errors.Join(errs...); err != nil {
		d.t.Errorf("answering %q: %v", key, err)
	}
	return nil
}

// demandProxy returns the least Proxy the fetch functions use: store, the
// node's network, local workload c//Pod/ns/server, and d as its demander
// (none if d is nil), which is told the proxy's lifetime to check demands
// against.
func demandProxy(t *testing.T, store *state.Store, network string, d *fakeDemander) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := &Proxy{
		cfg: Config{Store: store, Network: network, WorkloadUID: "c//Pod/ns/server",
			Metrics: telemetry.NewMetrics(prometheus.NewRegistry())},
		log:      slog.New(slog.DiscardHandler),
		lifetime: ctx,
		demands:  newDemandGate(DemandLimits{}),
	}
	if d != nil {
		d.ctx = ctx
		p.cfg.Demand = d
	}
	return p
}

// svcKey is the key of service name in namespace ns of the on-demand tests.
func svcKey(name string) string { return state.HostnameKey("ns", name+".ns.svc.cluster.local") }

// nsService is service ns/name of the on-demand tests, at vip if it is not
// empty.
func nsService(name, vip string) *state.Service {
	s := &state.Service{Name: name, Namespace: "ns", Hostname: name + ".ns.svc.cluster.local"}
	if vip != "" {
		s.VIPs = []state.NetworkAddress{{Address: ip(vip)}}
	}
	return s
}

// byHostname is a gateway naming service ns/name by hostname.
func byHostname(name string) *state.GatewayAddress {
	return &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns",
		Hostname: name + ".ns.svc.cluster.local"}, HBONEMTLSPort: 15008}
}

// byAddress is a gateway at addr on network.
func byAddress(network, addr string) *state.GatewayAddress {
	return &state.GatewayAddress{Address: &state.NetworkAddress{Network: network, Address: ip(addr)},
		HBONEMTLSPort: 15008}
}

// behind returns w with waypoint wp.
func behind(w *state.Workload, wp *state.GatewayAddress) *state.Workload {
	w.Waypoint = wp
	return w
}

// onNetwork returns w on network.
func onNetwork(w *state.Workload, network string) *state.Workload {
	w.Network = network
	return w
}

// endpointOf returns w as an endpoint of the services keys.
func endpointOf(w *state.Workload, keys ...string) *state.Workload {
	w.Services = map[string]state.PortMap{}
	for _, k := range keys {
		w.Services[k] = state.PortMap{15008: 15008}
	}
	return w
}

// inserts returns a store fill that inserts ws and ss.
func inserts(ws []*state.Workload, ss ...*state.Service) func(b *state.Batch) []error {
	return func(b *state.Batch) []error {
		var errs []error
		for _, s := range ss {
			errs = append(errs, b.InsertService(s))
		}
		for _, w := range ws {
			errs = append(errs, b.InsertWorkload(w))
		}
		return errs
	}
}

// wls is a list of workloads, for inserts.
func wls(ws ...*state.Workload) []*state.Workload { return ws }

// holds reports whether snap has name: a workload uid, a service key, or a
// "network/IP" that a workload has or a service visible from namespace ns
// has as its VIP.
func holds(snap *state.Snapshot, name string) bool {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		if a, err := netip.ParseAddr(name[i+1:]); err == nil {
			return snap.WorkloadByIP(name[:i], a) != nil || snap.ServiceByVIP(name[:i], a, "ns") != nil
		}
	}
	return snap.WorkloadByUID(name) != nil || snap.ServiceByKey(name) != nil
}

// demandCase is a store, the answers istiod gives on demand, and what a
// fetch must demand and leave in the snapshot it returns.
type demandCase struct {
	name    string
	network string // Config.Network
	off     bool   // no Config.Demand
	local   func(*state.Snapshot) *state.Workload
	fill    func(b *state.Batch) []error // the store before the connection
	answers map[string]func(b *state.Batch) []error
	want    []string // the keys demanded, in order
	has     []string // names (see holds) the returned snapshot holds
	lacks   []string // names it does not hold
}

// run builds c's store and proxy, calls fetch with a snapshot the store has
// since moved past, and checks the keys demanded and the snapshot
// returned: the one given when nothing was demanded, else the store's
// newest.
func (c *demandCase) run(t *testing.T, fetch func(p *Proxy, snap *state.Snapshot) *state.Snapshot) {
	t.Helper()
	fill := c.fill
	if fill == nil {
		fill = func(*state.Batch) []error { return nil }
	}
	store := storeWith(t, fill)
	snap := store.Snapshot()
	store.Update(func(b *state.Batch) {
		if err := b.InsertWorkload(nsWorkload("bystander", "10.255.0.1")); err != nil {
			t.Fatal(err)
		}
	})
	d := &fakeDemander{t: t, store: store, answers: c.answers}
	var demander *fakeDemander
	if !c.off {
		demander = d
	}
	p := demandProxy(t, store, c.network, demander)
	p.cfg.Local = c.local

	got := fetch(p, snap)
	if diff := cmp.Diff(c.want, d.asked); diff != "" {
		t.Errorf("demanded keys (-want +got):\n%s", diff)
	}
	if len(d.asked) == 0 && got != snap {
		t.Error("nothing was demanded, but the snapshot returned is not the one given")
	}
	if len(d.asked) > 0 && got != store.Snapshot() {
		t.Error("after a demand, the snapshot returned is not the store's newest")
	}
	for _, name := range c.has {
		if !holds(got, name) {
			t.Errorf("the snapshot returned lacks %s", name)
		}
	}
	for _, name := range c.lacks {
		if holds(got, name) {
			t.Errorf("the snapshot returned holds %s", name)
		}
	}
}

// TestFetchOutbound checks what fetchOutbound demands for a connection from
// ns/client to a destination, and what the snapshot it returns holds: the
// destination by network/IP when it is neither a known workload nor a known
// service VIP, then the waypoints and network gateway of what it found, each
// by hostname or address. A failed demand leaves the thing unknown and asks
// nothing more about it.
func TestFetchOutbound(t *testing.T) {
	wpKey := svcKey("waypoint")
	waypoint := func() *state.Workload { return endpointOf(nsWorkload("waypoint", "10.0.0.11"), wpKey) }
	cases := []struct {
		demandCase
		dst string
	}{
		{demandCase: demandCase{name: "demand off", off: true}, dst: "10.0.0.3:80"},
		{demandCase: demandCase{name: "known workload",
			fill: inserts(wls(nsWorkload("server", "10.0.0.2")))}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "unknown address",
			answers: map[string]func(*state.Batch) []error{"/10.0.0.3": inserts(wls(nsWorkload("server", "10.0.0.3")))},
			want:    []string{"/10.0.0.3"}, has: []string{"c//Pod/ns/server", "/10.0.0.3"}}, dst: "10.0.0.3:80"},
		{demandCase: demandCase{name: "unknown IPv4-mapped address",
			answers: map[string]func(*state.Batch) []error{"/10.0.0.3": inserts(wls(nsWorkload("server", "10.0.0.3")))},
			want:    []string{"/10.0.0.3"}, has: []string{"c//Pod/ns/server"}}, dst: "[::ffff:10.0.0.3]:80"},
		{demandCase: demandCase{name: "unknown address on the node's network", network: "net1",
			answers: map[string]func(*state.Batch) []error{
				"net1/10.0.0.3": inserts(wls(onNetwork(nsWorkload("server", "10.0.0.3"), "net1")))},
			want: []string{"net1/10.0.0.3"}, has: []string{"net1/10.0.0.3"}}, dst: "10.0.0.3:80"},
		{demandCase: demandCase{name: "known service VIP",
			fill: inserts(nil, nsService("svc", "10.96.0.1"))}, dst: "10.96.0.1:80"},
		{demandCase: demandCase{name: "unknown address answered by a service with an unknown waypoint",
			answers: map[string]func(*state.Batch) []error{
				"/10.96.0.2": func(b *state.Batch) []error {
					s := nsService("svc", "10.96.0.2")
					s.Waypoint = byHostname("waypoint")
					return []error{b.InsertService(s)}
				},
				wpKey: inserts(wls(waypoint()), nsService("waypoint", "")),
			},
			want: []string{"/10.96.0.2", wpKey}, has: []string{svcKey("svc"), wpKey, "c//Pod/ns/waypoint"}},
			dst: "10.96.0.2:80"},
		{demandCase: demandCase{name: "unknown hostname waypoint",
			fill:    inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")))),
			answers: map[string]func(*state.Batch) []error{wpKey: inserts(wls(waypoint()), nsService("waypoint", ""))},
			want:    []string{wpKey}, has: []string{wpKey, "c//Pod/ns/waypoint"}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "hostname waypoint answered without its workloads",
			fill:    inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")))),
			answers: map[string]func(*state.Batch) []error{wpKey: inserts(nil, nsService("waypoint", ""))},
			want:    []string{wpKey}, has: []string{wpKey}, lacks: []string{"c//Pod/ns/waypoint"}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "known hostname waypoint with its endpoints",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")), waypoint()),
				nsService("waypoint", ""))}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "hostname waypoint naming a workload hostname",
			fill: func(b *state.Batch) []error {
				wp := nsWorkload("waypoint", "10.0.0.11")
				wp.Hostname = "waypoint.ns.svc.cluster.local"
				return inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")), wp))(b)
			}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "hostname waypoint naming a workload hostname of another namespace",
			fill: func(b *state.Batch) []error {
				wp := nsWorkload("waypoint", "10.0.0.11")
				wp.Namespace, wp.Hostname = "other", "waypoint.ns.svc.cluster.local"
				return inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")), wp))(b)
			},
			want: []string{wpKey}, lacks: []string{wpKey}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "unknown address waypoint",
			fill:    inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("", "10.0.0.11")))),
			answers: map[string]func(*state.Batch) []error{"/10.0.0.11": inserts(wls(waypoint()))},
			want:    []string{"/10.0.0.11"}, has: []string{"c//Pod/ns/waypoint"}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "unknown address waypoint on another network",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("net2", "10.0.0.11")))),
			answers: map[string]func(*state.Batch) []error{
				"net2/10.0.0.11": inserts(wls(onNetwork(waypoint(), "net2")))},
			want: []string{"net2/10.0.0.11"}, has: []string{"net2/10.0.0.11"}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "unknown address waypoint answered by a service",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("", "10.0.0.10")))),
			answers: map[string]func(*state.Batch) []error{
				"/10.0.0.10": inserts(wls(waypoint()), nsService("waypoint", "10.0.0.10"))},
			want: []string{"/10.0.0.10"}, has: []string{wpKey, "c//Pod/ns/waypoint"}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "known address waypoint",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("", "10.0.0.11")), waypoint()))},
			dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "known address waypoint service with its endpoints",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("", "10.0.0.10")), waypoint()),
				nsService("waypoint", "10.0.0.10"))}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "service waypoint and weighted waypoints",
			fill: func(b *state.Batch) []error {
				s := nsService("svc", "10.96.0.1")
				s.Waypoint = byHostname("waypoint")
				s.WeightedWaypoints = []state.WeightedWaypoint{
					{Destination: *byHostname("wp-a"), Weight: 1}, {Destination: *byAddress("", "10.0.0.20"), Weight: 1}}
				return []error{b.InsertService(s)}
			},
			answers: map[string]func(*state.Batch) []error{
				wpKey:          inserts(wls(waypoint()), nsService("waypoint", "")),
				svcKey("wp-a"): inserts(nil, nsService("wp-a", "")),
				"/10.0.0.20":   inserts(wls(nsWorkload("wp-b", "10.0.0.20"))),
			},
			want: []string{wpKey, svcKey("wp-a"), "/10.0.0.20"},
			has:  []string{wpKey, "c//Pod/ns/waypoint", svcKey("wp-a"), "c//Pod/ns/wp-b"}}, dst: "10.96.0.1:80"},
		{demandCase: demandCase{name: "network gateway after a failed waypoint demand",
			fill: func(b *state.Batch) []error {
				w := behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint"))
				w.NetworkGateway = byAddress("net2", "192.0.2.1")
				return []error{b.InsertWorkload(w)}
			},
			answers: map[string]func(*state.Batch) []error{
				"net2/192.0.2.1": inserts(wls(onNetwork(nsWorkload("gateway", "192.0.2.1"), "net2")))},
			want: []string{wpKey, "net2/192.0.2.1"}, has: []string{"net2/192.0.2.1"}, lacks: []string{wpKey}},
			dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "failed address demand",
			want: []string{"/10.0.0.7"}, lacks: []string{"/10.0.0.7"}}, dst: "10.0.0.7:80"},
		{demandCase: demandCase{name: "failed hostname waypoint demand",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byHostname("waypoint")))),
			want: []string{wpKey}, lacks: []string{wpKey}}, dst: "10.0.0.2:80"},
		{demandCase: demandCase{name: "failed address waypoint demand",
			fill: inserts(wls(behind(nsWorkload("server", "10.0.0.2"), byAddress("", "10.0.0.11")))),
			want: []string{"/10.0.0.11"}, lacks: []string{"/10.0.0.11"}}, dst: "10.0.0.2:80"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := nsWorkload("client", "10.0.0.1"), netip.MustParseAddrPort(tc.dst)
			tc.run(t, func(p *Proxy, snap *state.Snapshot) *state.Snapshot { return p.fetchOutbound(snap, src, dst) })
		})
	}
}

// TestFetchGatewayMissingEndpoint checks that fetchGateway demands, by uid,
// an endpoint of a gateway service whose workload the snapshot lacks, and
// only that one. A published snapshot never has such an endpoint (the store
// builds endpoints from the workloads it holds), so the test reads the
// snapshot of a batch that has just removed the workload: a batch brings
// service endpoints up to date only when it commits.
func TestFetchGatewayMissingEndpoint(t *testing.T) {
	wpKey := svcKey("waypoint")
	store := storeWith(t, inserts(wls(endpointOf(nsWorkload("wp-a", "10.0.0.10"), wpKey),
		endpointOf(nsWorkload("wp-b", "10.0.0.11"), wpKey)), nsService("waypoint", "")))
	before := store.Snapshot()
	d := &fakeDemander{t: t, store: store} // no answers: it must not update the store mid-batch
	p := demandProxy(t, store, "", d)
	var got *state.Snapshot
	store.Update(func(b *state.Batch) {
		b.RemoveWorkload("c//Pod/ns/wp-a")
		snap := b.Snapshot()
		if n := snap.ServiceByKey(wpKey).Endpoints.Len(); n != 2 || snap.WorkloadByUID("c//Pod/ns/wp-a") != nil {
			t.Fatalf("the batch's snapshot has %d endpoints of %s, want 2 with one workload missing", n, wpKey)
		}
		got = p.fetchGateway(snap, byHostname("waypoint"), "ns")
	})
	if diff := cmp.Diff([]string{"c//Pod/ns/wp-a"}, d.asked); diff != "" {
		t.Errorf("demanded keys (-want +got):\n%s", diff)
	}
	if got != before {
		t.Error("after a failed demand, the snapshot returned is not the store's newest")
	}
}

// TestFetchInbound checks what fetchInbound demands for an HBONE connection
// from 10.0.0.1 that reached the local workload ns/server at 10.0.0.2: the
// peer's address unless it came through a gateway, then an authority IP
// other than the one reached that is neither a known workload nor a known
// service VIP, unless the authority is a hostname or the local workload is
// unknown or terminates an application tunnel itself.
func TestFetchInbound(t *testing.T) {
	server := func() *state.Workload { return nsWorkload("server", "10.0.0.2") }
	client := func() *state.Workload { return nsWorkload("client", "10.0.0.1") }
	other := func() *state.Workload { return nsWorkload("other", "10.0.0.9") }
	cases := []struct {
		demandCase
		method     string // if empty CONNECT
		authority  string
		viaGateway bool
	}{
		{demandCase: demandCase{name: "demand off", off: true, fill: inserts(wls(server()))}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "known peer, authority the address reached",
			fill: inserts(wls(server(), client()))}, authority: "10.0.0.2:8080"},
		{demandCase: demandCase{name: "authority the address reached by a host-network local workload",
			fill: func(b *state.Batch) []error {
				w := server()
				w.NetworkMode = state.NetworkHost
				return inserts(wls(w, client()))(b)
			}}, authority: "10.0.0.2:8080"},
		{demandCase: demandCase{name: "unknown peer", fill: inserts(wls(server())),
			answers: map[string]func(*state.Batch) []error{"/10.0.0.1": inserts(wls(client()))},
			want:    []string{"/10.0.0.1"}, has: []string{"c//Pod/ns/client"}}, authority: "10.0.0.2:8080"},
		{demandCase: demandCase{name: "unknown peer through a gateway", fill: inserts(wls(server())),
			lacks: []string{"/10.0.0.1"}}, authority: "10.0.0.2:8080", viaGateway: true},
		{demandCase: demandCase{name: "unknown peer on the node's network", network: "net1",
			fill: inserts(wls(onNetwork(server(), "net1"))),
			answers: map[string]func(*state.Batch) []error{
				"net1/10.0.0.1": inserts(wls(onNetwork(client(), "net1")))},
			want: []string{"net1/10.0.0.1"}, has: []string{"net1/10.0.0.1"}}, authority: "10.0.0.2:8080"},
		{demandCase: demandCase{name: "failed peer demand", fill: inserts(wls(server())),
			want: []string{"/10.0.0.1"}, lacks: []string{"/10.0.0.1"}}, authority: "10.0.0.2:8080"},
		{demandCase: demandCase{name: "unknown authority address", fill: inserts(wls(server(), client())),
			answers: map[string]func(*state.Batch) []error{"/10.0.0.9": inserts(wls(other()))},
			want:    []string{"/10.0.0.9"}, has: []string{"c//Pod/ns/other"}}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "unknown authority address answered by a service",
			fill:    inserts(wls(server(), client())),
			answers: map[string]func(*state.Batch) []error{"/10.96.0.9": inserts(nil, nsService("svc", "10.96.0.9"))},
			want:    []string{"/10.96.0.9"}, has: []string{svcKey("svc")}}, authority: "10.96.0.9:80"},
		{demandCase: demandCase{name: "failed authority demand", fill: inserts(wls(server(), client())),
			want: []string{"/10.0.0.9"}, lacks: []string{"/10.0.0.9"}}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "known authority workload",
			fill: inserts(wls(server(), client(), other()))}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "known authority service VIP",
			fill: inserts(wls(server(), client()), nsService("svc", "10.96.0.1"))}, authority: "10.96.0.1:80"},
		{demandCase: demandCase{name: "authority hostname",
			fill: inserts(wls(server(), client()))}, authority: "svc.ns.svc.cluster.local:80"},
		{demandCase: demandCase{name: "malformed authority",
			fill: inserts(wls(server(), client()))}, authority: "10.0.0.9"},
		// Requests refused before any state is read fetch nothing, not even
		// the unknown peer (issue 36: a flood of bad requests must not
		// reach istiod).
		{demandCase: demandCase{name: "malformed authority, unknown peer",
			fill: inserts(wls(server()))}, authority: "10.0.0.9"},
		{demandCase: demandCase{name: "not CONNECT, unknown peer and authority address",
			fill: inserts(wls(server()))}, method: "GET", authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "local workload with an application tunnel",
			fill: func(b *state.Batch) []error {
				w := server()
				w.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088}
				return inserts(wls(w, client()))(b)
			}}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "unknown local workload",
			fill: inserts(wls(client()))}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "local workload by Config.Local",
			fill: func(b *state.Batch) []error {
				w := server()
				w.UID = "c//Pod/ns/server-by-name"
				return inserts(wls(w, client()))(b)
			},
			local: func(s *state.Snapshot) *state.Workload { return s.FindWorkload("", "ns", "server", "server") },
			want:  []string{"/10.0.0.9"}}, authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "unknown peer and authority address", fill: inserts(wls(server())),
			answers: map[string]func(*state.Batch) []error{
				"/10.0.0.1": inserts(wls(client())), "/10.0.0.9": inserts(wls(other()))},
			want: []string{"/10.0.0.1", "/10.0.0.9"}, has: []string{"c//Pod/ns/client", "c//Pod/ns/other"}},
			authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "failed peer demand, then the authority address",
			fill: inserts(wls(server())),
			want: []string{"/10.0.0.1", "/10.0.0.9"}, lacks: []string{"/10.0.0.1", "/10.0.0.9"}},
			authority: "10.0.0.9:80"},
		{demandCase: demandCase{name: "through a gateway, the authority address only",
			fill: inserts(wls(server())), want: []string{"/10.0.0.9"}}, authority: "10.0.0.9:80", viaGateway: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, l3dst := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:15008")
			tc.run(t, func(p *Proxy, snap *state.Snapshot) *state.Snapshot {
				method := tc.method
				if method == "" {
					method = "CONNECT"
				}
				return p.fetchInbound(snap, src, l3dst, method, tc.authority, tc.viaGateway)
			})
		})
	}
}

// TestFetchPeer checks that fetchPeer demands the peer's network/IP, its
// IPv4-mapped form unmapped, only when Config.Demand is set and the peer is
// not a known workload.
func TestFetchPeer(t *testing.T) {
	client := func() *state.Workload { return nsWorkload("client", "10.0.0.1") }
	answer := map[string]func(*state.Batch) []error{"/10.0.0.1": inserts(wls(client()))}
	cases := []struct {
		demandCase
		src string
	}{
		{demandCase: demandCase{name: "demand off", off: true}, src: "10.0.0.1:40000"},
		{demandCase: demandCase{name: "known peer", fill: inserts(wls(client()))}, src: "10.0.0.1:40000"},
		{demandCase: demandCase{name: "known IPv4-mapped peer", fill: inserts(wls(client()))},
			src: "[::ffff:10.0.0.1]:40000"},
		{demandCase: demandCase{name: "unknown peer", answers: answer,
			want: []string{"/10.0.0.1"}, has: []string{"c//Pod/ns/client"}}, src: "10.0.0.1:40000"},
		{demandCase: demandCase{name: "unknown IPv4-mapped peer", answers: answer,
			want: []string{"/10.0.0.1"}, has: []string{"c//Pod/ns/client"}}, src: "[::ffff:10.0.0.1]:40000"},
		{demandCase: demandCase{name: "unknown peer on the node's network", network: "net1",
			want: []string{"net1/10.0.0.1"}, lacks: []string{"net1/10.0.0.1"}}, src: "10.0.0.1:40000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := netip.MustParseAddrPort(tc.src)
			tc.run(t, func(p *Proxy, snap *state.Snapshot) *state.Snapshot { return p.fetchPeer(snap, src) })
		})
	}
}

// countingDemander is a state.Demander that counts the demands it is asked
// for and answers each with a miss, after waiting for release if that is
// non-nil.
type countingDemander struct {
	asked   atomic.Int64
	release chan struct{}
}

func (d *countingDemander) Demand(ctx context.Context, key string) error {
	d.asked.Add(1)
	if d.release != nil {
		select {
		case <-d.release:
		case <-ctx.Done():
		}
	}
	return errNoAnswer
}

// TestDemandFloodBounded: a flood of CONNECTs naming 100,000 different
// unknown authority IPs (what any mTLS peer can send) asks the demander at
// most the token bucket's worth: the burst plus the rate over the flood's
// duration. Every fetch not sent is counted in
// gozt_xds_on_demand_refused_total, and once the bucket refills a
// legitimate fetch goes out again. Before the bound every one of the
// 100,000 became a request to istiod (issue 36).
func TestDemandFloodBounded(t *testing.T) {
	const flood, burst, perSecond = 100_000, 20, 100
	store := storeWith(t, inserts(wls(nsWorkload("server", "10.0.0.2"), nsWorkload("client", "10.0.0.1"))))
	p := demandProxy(t, store, "", nil)
	d := &countingDemander{}
	p.cfg.Demand = d
	p.demands = newDemandGate(DemandLimits{Rate: perSecond, Burst: burst})
	src, l3dst := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:15008")

	start := time.Now()
	for i := range flood {
		auth := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80).String()
		p.fetchInbound(store.Snapshot(), src, l3dst, "CONNECT", auth, false)
	}
	elapsed := time.Since(start)
	asked := d.asked.Load()
	if bound := burst + int64(elapsed.Seconds()*perSecond) + 1; asked > bound {
		t.Errorf("%d CONNECTs in %v asked the demander %d times, want at most %d", flood, elapsed, asked, bound)
	}
	if asked < burst {
		t.Errorf("the demander was asked %d times, want at least the burst, %d", asked, burst)
	}
	refused := testutil.ToFloat64(p.cfg.Metrics.DemandRefusals(telemetry.DemandRefusedRate))
	if int64(refused)+asked != flood {
		t.Errorf("refused %v + asked %d, want %d", refused, asked, flood)
	}

	// The bucket refills: a new unknown address is asked for again.
	time.Sleep(2 * time.Second / perSecond)
	before := d.asked.Load()
	p.fetchInbound(store.Snapshot(), src, l3dst, "CONNECT", "10.2.0.1:80", false)
	if d.asked.Load() != before+1 {
		t.Error("after the flood, a fetch with a token in the bucket was not sent")
	}
}

// TestDemandOutstandingBounded: with istiod silent, at most Outstanding
// fetches of one proxy wait at once; one more is refused at once (counted
// as "outstanding") rather than holding a goroutine and a request, and a
// slot freed by an answer is usable again.
func TestDemandOutstandingBounded(t *testing.T) {
	const outstanding = 4
	store := storeWith(t, inserts(wls(nsWorkload("server", "10.0.0.2"), nsWorkload("client", "10.0.0.1"))))
	p := demandProxy(t, store, "", nil)
	d := &countingDemander{release: make(chan struct{})}
	p.cfg.Demand = d
	p.demands = newDemandGate(DemandLimits{Rate: 1e6, Burst: 1000, Outstanding: outstanding})
	src, l3dst := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.0.2:15008")
	fetch := func(i int) {
		p.fetchInbound(store.Snapshot(), src, l3dst, "CONNECT", fmt.Sprintf("10.1.0.%d:80", i), false)
	}

	var wg sync.WaitGroup
	for i := range outstanding {
		wg.Go(func() { fetch(i) })
	}
	for d.asked.Load() < outstanding {
		time.Sleep(time.Millisecond)
	}
	// Every slot is taken: one more returns at once, without waiting for
	// istiod.
	returned := make(chan struct{})
	go func() { fetch(100); close(returned) }()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		close(d.release)
		<-returned
		wg.Wait()
		t.Fatalf("a fetch past %d outstanding waited for istiod", outstanding)
	}
	refused := p.cfg.Metrics.DemandRefusals(telemetry.DemandRefusedOutstanding)
	if got := testutil.ToFloat64(refused); got != 1 || d.asked.Load() != outstanding {
		t.Errorf("with %d fetches waiting, one more: refused %v, demander asked %d; want 1 and %d", outstanding, got, d.asked.Load(), outstanding)
	}
	close(d.release)
	wg.Wait()
	fetch(101)
	if d.asked.Load() != outstanding+1 {
		t.Errorf("after the waits ended the demander was asked %d times, want %d", d.asked.Load(), outstanding+1)
	}
}
