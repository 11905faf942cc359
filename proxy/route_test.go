package proxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/state"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func newRouteStore(t *testing.T) *state.Snapshot {
	t.Helper()
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		add := func(err error) { errs = append(errs, err) }
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/client", Name: "client", Namespace: "ns",
			ServiceAccount: "client", Addresses: []netip.Addr{ip("10.0.0.1")}, Protocol: state.TunnelHBONE}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/server", Name: "server", Namespace: "ns",
			ServiceAccount: "server", Addresses: []netip.Addr{ip("10.0.0.2")}, Protocol: state.TunnelHBONE,
			Services: map[string]state.PortMap{"ns/svc.ns.svc.cluster.local": {80: 8080}}}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/legacy", Name: "legacy", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.0.0.3")}, Protocol: state.TunnelNone}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/waypoint", Name: "waypoint", Namespace: "ns",
			ServiceAccount: "waypoint", Addresses: []netip.Addr{ip("10.0.0.10")}, Protocol: state.TunnelHBONE}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/behindwp", Name: "behindwp", Namespace: "ns",
			ServiceAccount: "b", Addresses: []netip.Addr{ip("10.0.0.4")}, Protocol: state.TunnelHBONE,
			Waypoint: &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.0.0.10")}, HBONEMTLSPort: 15008}}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/remote", Name: "remote", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.9.0.1")}, Network: "other", Protocol: state.TunnelHBONE}))
		add(b.InsertService(&state.Service{Name: "svc", Namespace: "ns", Hostname: "svc.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.0.1")}}, Ports: state.PortMap{80: 8080},
			SubjectAltNames: []string{"spiffe://cluster.local/ns/ns/sa/extra"}}))
		add(b.InsertService(&state.Service{Name: "pt", Namespace: "ns", Hostname: "pt.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.0.2")}}, Ports: state.PortMap{80: 80},
			LoadBalancer: &state.LoadBalancer{Mode: state.LBPassthrough}}))
		add(b.InsertService(&state.Service{Name: "empty", Namespace: "ns", Hostname: "empty.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.0.3")}}, Ports: state.PortMap{80: 80}}))
		add(b.InsertService(&state.Service{Name: "wp", Namespace: "ns", Hostname: "wp.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.0.4")}}, Ports: state.PortMap{80: 80},
			Waypoint: &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.0.0.10")}, HBONEMTLSPort: 15008}}))
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return st.Snapshot()
}

func TestDecide(t *testing.T) {
	snap := newRouteStore(t)
	client := snap.WorkloadByUID("c//Pod/ns/client")
	waypoint := snap.WorkloadByUID("c//Pod/ns/waypoint")
	type want struct {
		Kind      string
		Dial      string
		Authority string
		SANs      []string
		Workload  string
		Waypoint  bool
	}
	for _, tc := range []struct {
		name    string
		src     *state.Workload
		down    string
		dst     string
		want    want
		wantErr error
	}{
		{name: "workload by IP", src: client, down: "10.0.0.1", dst: "10.0.0.2:8080", want: want{
			Kind: "HBONE", Dial: "10.0.0.2:15008", Authority: "10.0.0.2:8080",
			SANs: []string{"spiffe://cluster.local/ns/ns/sa/server"}, Workload: "c//Pod/ns/server"}},
		{name: "non-HBONE workload", src: client, down: "10.0.0.1", dst: "10.0.0.3:9000", want: want{
			Kind: "TCP", Dial: "10.0.0.3:9000", Workload: "c//Pod/ns/legacy"}},
		{name: "unknown destination", src: client, down: "10.0.0.1", dst: "192.0.2.1:443", want: want{
			Kind: "passthrough", Dial: "192.0.2.1:443"}},
		{name: "service VIP", src: client, down: "10.0.0.1", dst: "10.96.0.1:80", want: want{
			Kind: "HBONE", Dial: "10.0.0.2:15008", Authority: "10.0.0.2:8080",
			SANs:     []string{"spiffe://cluster.local/ns/ns/sa/extra", "spiffe://cluster.local/ns/ns/sa/server"},
			Workload: "c//Pod/ns/server"}},
		{name: "service port not defined", src: client, down: "10.0.0.1", dst: "10.96.0.1:81", wantErr: errNoHealthyUpstream},
		{name: "passthrough service", src: client, down: "10.0.0.1", dst: "10.96.0.2:80", want: want{
			Kind: "passthrough", Dial: "10.96.0.2:80"}},
		{name: "service without endpoints", src: client, down: "10.0.0.1", dst: "10.96.0.3:80", wantErr: errNoHealthyUpstream},
		{name: "service waypoint", src: client, down: "10.0.0.1", dst: "10.96.0.4:80", want: want{
			Kind: "HBONE", Dial: "10.0.0.10:15008", Authority: "10.96.0.4:80",
			SANs: []string{"spiffe://cluster.local/ns/ns/sa/waypoint"}, Workload: "c//Pod/ns/waypoint", Waypoint: true}},
		{name: "workload waypoint", src: client, down: "10.0.0.1", dst: "10.0.0.4:80", want: want{
			Kind: "HBONE", Dial: "10.0.0.10:15008", Authority: "10.0.0.4:80",
			SANs: []string{"spiffe://cluster.local/ns/ns/sa/waypoint"}, Workload: "c//Pod/ns/waypoint", Waypoint: true}},
		{name: "from the waypoint itself", src: waypoint, down: "10.0.0.10", dst: "10.0.0.4:80", want: want{
			Kind: "HBONE", Dial: "10.0.0.4:15008", Authority: "10.0.0.4:80",
			SANs: []string{"spiffe://cluster.local/ns/ns/sa/b"}, Workload: "c//Pod/ns/behindwp"}},
		{name: "other network", src: client, down: "10.0.0.1", dst: "10.9.0.1:80", wantErr: nil, want: want{
			Kind: "passthrough", Dial: "10.9.0.1:80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := router{snap: snap}
			rt, err := r.decide(tc.src, ip(tc.down), netip.MustParseAddrPort(tc.dst))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("decide(%s) error = %v, want %v", tc.dst, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decide(%s): %v", tc.dst, err)
			}
			got := want{Kind: rt.kind.String(), Dial: rt.dial.String(), Authority: rt.authority, SANs: rt.sans, Waypoint: rt.waypoint}
			if rt.workload != nil {
				got.Workload = rt.workload.UID
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decide(%s) mismatch (-want +got):\n%s", tc.dst, diff)
			}
		})
	}
}

// TestDecideRemoteNetwork: an endpoint or service waypoint on another
// network is reached through its network gateway (SPEC §2.6, §3.5, ztunnel's
// build_request_through_gateway): the outer tunnel to the gateway expects
// the gateway's SANs, the inner one only the SANs of the service it ends at,
// both with authority svcHostname:servicePort; no gateway fails.
func TestDecideRemoteNetwork(t *testing.T) {
	const (
		svcSAN = "spiffe://cluster.local/ns/ns/sa/r-san"
		gwSAN  = "spiffe://cluster.local/ns/istio-system/sa/gw-san"
		wpSAN  = "spiffe://cluster.local/ns/ns/sa/wp-san"
	)
	byIP := &state.GatewayAddress{Address: &state.NetworkAddress{Network: "other", Address: ip("192.0.2.10")}, HBONEMTLSPort: 15009}
	byVIP := &state.GatewayAddress{Address: &state.NetworkAddress{Network: "other", Address: ip("192.0.2.100")}, HBONEMTLSPort: 15008}
	byHost := &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "istio-system", Hostname: "gw.istio-system.svc.cluster.local"}, HBONEMTLSPort: 15008}
	gwID := "spiffe://cluster.local/ns/istio-system/sa/gw"
	for _, tc := range []struct {
		name     string
		gw       *state.GatewayAddress
		noIPs    bool // the remote endpoint has no address, only the gateway
		waypoint bool // the service has a waypoint on the other network
		want     route
		wantErr  error
	}{
		{name: "no gateway", wantErr: errNoNetworkGateway},
		{name: "gateway by workload IP", gw: byIP, want: route{dial: netip.MustParseAddrPort("192.0.2.10:15009"), sans: []string{gwID}, inner: &innerTunnel{sans: []string{svcSAN}}}},
		{name: "gateway by service VIP", gw: byVIP, want: route{dial: netip.MustParseAddrPort("192.0.2.10:15008"), sans: []string{gwID, gwSAN}, inner: &innerTunnel{sans: []string{svcSAN}}}},
		{name: "gateway by hostname", gw: byHost, want: route{dial: netip.MustParseAddrPort("192.0.2.10:15008"), sans: []string{gwID, gwSAN}, inner: &innerTunnel{sans: []string{svcSAN}}}},
		{name: "endpoint without address", gw: byHost, noIPs: true, want: route{dial: netip.MustParseAddrPort("192.0.2.10:15008"), sans: []string{gwID, gwSAN}, inner: &innerTunnel{sans: []string{svcSAN}}}},
		{name: "endpoint without address nor gateway", noIPs: true, wantErr: errNoHealthyUpstream},
		{name: "remote waypoint", gw: byIP, waypoint: true, want: route{dial: netip.MustParseAddrPort("192.0.2.10:15009"), sans: []string{gwID}, inner: &innerTunnel{sans: []string{wpSAN}}}},
		{name: "unknown gateway", gw: &state.GatewayAddress{Address: &state.NetworkAddress{Network: "other", Address: ip("192.0.2.99")}}, wantErr: errUnknownNetworkGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := state.NewStore(state.Config{})
			var errs []error
			st.Update(func(b *state.Batch) {
				add := func(err error) { errs = append(errs, err) }
				remote := &state.Workload{UID: "c//Pod/ns/remote", Name: "remote", Namespace: "ns",
					Addresses: []netip.Addr{ip("10.9.0.1")}, Network: "other", Protocol: state.TunnelHBONE, NetworkGateway: tc.gw,
					Services: map[string]state.PortMap{"ns/r.ns.svc.cluster.local": {80: 8080}}}
				if tc.noIPs {
					remote.Addresses = nil
				}
				add(b.InsertWorkload(remote))
				add(b.InsertWorkload(&state.Workload{UID: "c//Pod/istio-system/gw", Name: "gw", Namespace: "istio-system", ServiceAccount: "gw",
					Addresses: []netip.Addr{ip("192.0.2.10")}, Network: "other", Protocol: state.TunnelHBONE,
					Services: map[string]state.PortMap{"istio-system/gw.istio-system.svc.cluster.local": {15008: 15008}}}))
				add(b.InsertService(&state.Service{Name: "gw", Namespace: "istio-system", Hostname: "gw.istio-system.svc.cluster.local",
					VIPs: []state.NetworkAddress{{Network: "other", Address: ip("192.0.2.100")}}, Ports: state.PortMap{15008: 15008},
					SubjectAltNames: []string{gwSAN}}))
				svc := &state.Service{Name: "r", Namespace: "ns", Hostname: "r.ns.svc.cluster.local",
					VIPs: []state.NetworkAddress{{Address: ip("10.96.1.1")}}, Ports: state.PortMap{80: 8080},
					SubjectAltNames: []string{svcSAN}}
				if tc.waypoint {
					add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/wp", Name: "wp", Namespace: "ns", ServiceAccount: "wp",
						Addresses: []netip.Addr{ip("10.9.0.9")}, Network: "other", Protocol: state.TunnelHBONE, NetworkGateway: tc.gw,
						Services: map[string]state.PortMap{"ns/wp.ns.svc.cluster.local": {15008: 15008}}}))
					add(b.InsertService(&state.Service{Name: "wp", Namespace: "ns", Hostname: "wp.ns.svc.cluster.local",
						VIPs: []state.NetworkAddress{{Network: "other", Address: ip("10.9.96.9")}}, Ports: state.PortMap{15008: 15008},
						SubjectAltNames: []string{wpSAN}}))
					svc.Waypoint = &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc.cluster.local"}, HBONEMTLSPort: 15008}
				}
				add(b.InsertService(svc))
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			snap := st.Snapshot()
			r := router{snap: snap}
			rt, err := r.decide(&state.Workload{Namespace: "ns"}, ip("10.0.0.1"), netip.MustParseAddrPort("10.96.1.1:80"))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("decide = %+v, %v; want %v", rt, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decide: %v", err)
			}
			if rt.kind != routeHBONE || rt.authority != "r.ns.svc.cluster.local:80" || rt.service == nil || rt.workload == nil || rt.workload.Name != "gw" {
				t.Errorf("decide = kind %v authority %q service %v workload %v, want HBONE to gw with authority r.ns.svc.cluster.local:80", rt.kind, rt.authority, rt.service, rt.workload)
			}
			wantDest := "remote"
			if tc.waypoint {
				wantDest = "wp"
			}
			if rt.inner == nil || rt.inner.dest == nil || rt.inner.dest.Name != wantDest {
				t.Fatalf("decide: inner = %+v, want one to %s", rt.inner, wantDest)
			}
			got := struct {
				Dial      string
				SANs      []string
				InnerSANs []string
			}{rt.dial.String(), rt.sans, rt.inner.sans}
			want := got
			want.Dial, want.SANs, want.InnerSANs = tc.want.dial.String(), tc.want.sans, tc.want.inner.sans
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("decide (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecideRemoteWorkloadWaypoint: a workload's own waypoint is dialled
// directly, in plain HBONE, even on another network: ztunnel's build_request
// crosses networks only for service-addressed traffic.
func TestDecideRemoteWorkloadWaypoint(t *testing.T) {
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		add := func(err error) { errs = append(errs, err) }
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/wp", Name: "wp", Namespace: "ns", ServiceAccount: "wp",
			Addresses: []netip.Addr{ip("10.9.0.9")}, Network: "other", Protocol: state.TunnelHBONE}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/w", Name: "w", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.0.0.7")}, Protocol: state.TunnelHBONE,
			Waypoint: &state.GatewayAddress{Address: &state.NetworkAddress{Network: "other", Address: ip("10.9.0.9")}, HBONEMTLSPort: 15008}}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	r := router{snap: st.Snapshot()}
	rt, err := r.decide(&state.Workload{Namespace: "ns"}, ip("10.0.0.1"), netip.MustParseAddrPort("10.0.0.7:80"))
	if err != nil || rt.kind != routeHBONE || rt.inner != nil || rt.dial.String() != "10.9.0.9:15008" || rt.authority != "10.0.0.7:80" {
		t.Errorf("decide = kind %v dial %v authority %q inner %v, %v; want HBONE to 10.9.0.9:15008 for 10.0.0.7:80, no inner tunnel",
			rt.kind, rt.dial, rt.authority, rt.inner, err)
	}
}

// TestPickEndpointWeights: the weighted pick follows capacity.
func TestPickEndpointWeights(t *testing.T) {
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		for i, c := range []uint32{1, 3} {
			b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/w" + string(rune('a'+i)), Name: "w", Namespace: "ns",
				Addresses: []netip.Addr{ip("10.0.1." + string(rune('1'+i)))}, Protocol: state.TunnelHBONE, Capacity: c,
				Services: map[string]state.PortMap{"ns/s": {80: 80}}})
		}
		b.InsertService(&state.Service{Name: "s", Namespace: "ns", Hostname: "s",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.2.1")}}, Ports: state.PortMap{80: 80}})
	})
	snap := st.Snapshot()
	svc := snap.ServiceByKey("ns/s")
	rng := rand.New(rand.NewPCG(1, 2))
	r := router{snap: snap, rand: func(total uint64) uint64 {
		if total != 4 {
			t.Fatalf("total weight = %d, want 4", total)
		}
		return rng.Uint64N(total)
	}}
	counts := map[uint32]int{}
	const n = 4000
	for range n {
		w, port, ok := r.pickEndpoint(svc, 80, nil)
		if !ok || port != 80 {
			t.Fatalf("pickEndpoint = %v, %d, %v", w, port, ok)
		}
		counts[w.Weight()]++
	}
	// Binomial(4000, 1/4): mean 1000, sd 27; ±4 sd.
	if counts[1] < 890 || counts[1] > 1110 || counts[1]+counts[3] != n {
		t.Errorf("capacity 1 vs 3 picked %d and %d times of %d; want about 1000 and 3000", counts[1], counts[3], n)
	}
}

// TestPickEndpointAllocs: load balancing, done for every connection to a
// service, allocates nothing (its two walks over the service's EndpointSet
// and the uid lookups included).
func TestPickEndpointAllocs(t *testing.T) {
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		for i := range 8 {
			b.InsertWorkload(&state.Workload{UID: fmt.Sprintf("c//Pod/ns/w%d", i), Name: "w", Namespace: "ns",
				Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)})}, Protocol: state.TunnelHBONE,
				Services: map[string]state.PortMap{"ns/s": {80: 8080}}})
		}
		b.InsertService(&state.Service{Name: "s", Namespace: "ns", Hostname: "s",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.2.1")}}, Ports: state.PortMap{80: 80}})
	})
	snap := st.Snapshot()
	svc := snap.ServiceByKey("ns/s")
	src := snap.WorkloadByUID("c//Pod/ns/w0")
	r := router{snap: snap, rand: func(total uint64) uint64 { return total - 1 }}
	if n := testing.AllocsPerRun(100, func() {
		if _, port, ok := r.pickEndpoint(svc, 80, src); !ok || port != 8080 {
			t.Fatalf("pickEndpoint: port %d, %v", port, ok)
		}
	}); n != 0 {
		t.Fatalf("pickEndpoint allocates %v times per call", n)
	}
}

// TestWaypointByVIPAddressFamily: a waypoint named by its service VIP is
// dialed on the waypoint endpoint's IP of the VIP's family, as ztunnel
// resolves a waypoint address (the address as given, SPEC §3.5), whatever
// the family of the original destination.
func TestWaypointByVIPAddressFamily(t *testing.T) {
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		errs = append(errs,
			b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/wp", Name: "wp", Namespace: "ns", ServiceAccount: "wp",
				Addresses: []netip.Addr{ip("fd00::10"), ip("10.0.0.10")}, Protocol: state.TunnelHBONE,
				Services: map[string]state.PortMap{"ns/wp.ns.svc.cluster.local": {15008: 15008}}}),
			b.InsertService(&state.Service{Name: "wp", Namespace: "ns", Hostname: "wp.ns.svc.cluster.local",
				VIPs: []state.NetworkAddress{{Address: ip("10.96.0.10")}}, Ports: state.PortMap{15008: 15008}}),
			b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/app", Name: "app", Namespace: "ns", ServiceAccount: "app",
				Addresses: []netip.Addr{ip("fd00::2"), ip("10.0.0.2")}, Protocol: state.TunnelHBONE,
				Waypoint: &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.96.0.10")}, HBONEMTLSPort: 15008}}),
		)
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r := router{snap: st.Snapshot()}
	rt, err := r.decide(&state.Workload{Namespace: "ns", Name: "client"}, ip("fd00::1"), netip.MustParseAddrPort("[fd00::2]:8080"))
	if err != nil {
		t.Fatal(err)
	}
	if rt.dial.String() != "10.0.0.10:15008" || rt.authority != "[fd00::2]:8080" || !rt.waypoint {
		t.Errorf("route = dial %s authority %s waypoint %v; want 10.0.0.10:15008, [fd00::2]:8080, via the waypoint", rt.dial, rt.authority, rt.waypoint)
	}
}

// newHostnameStore is a mesh with ServiceEntry-style endpoints: "ext"
// (plain TCP) and "exthbone" (HBONE) have a hostname and no IPs;
// "v4andhost" has an IPv4 address and a hostname, behind an IPv6-only
// service; "v4only" has the IPv4 address alone, behind the same kind of
// service; "wpdns" is a waypoint reached by hostname only.
func newHostnameStore(t *testing.T) *state.Snapshot {
	t.Helper()
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		add := func(err error) { errs = append(errs, err) }
		add(b.InsertWorkload(&state.Workload{UID: "se/ext", Name: "ext", Namespace: "ns", Hostname: "api.example.com",
			Services: map[string]state.PortMap{"ns/ext.example.com": {443: 8443}}}))
		add(b.InsertService(&state.Service{Name: "ext", Namespace: "ns", Hostname: "ext.example.com",
			VIPs:  []state.NetworkAddress{{Address: ip("10.96.5.1")}, {Address: ip("fd00:96::5")}},
			Ports: state.PortMap{443: 8443}}))
		add(b.InsertWorkload(&state.Workload{UID: "se/exthbone", Name: "exthbone", Namespace: "ns", ServiceAccount: "e",
			Hostname: "mesh.example.com", Protocol: state.TunnelHBONE,
			Services: map[string]state.PortMap{"ns/exthbone.example.com": {80: 8080}}}))
		add(b.InsertService(&state.Service{Name: "exthbone", Namespace: "ns", Hostname: "exthbone.example.com",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.5.2")}}, Ports: state.PortMap{80: 8080}}))
		add(b.InsertWorkload(&state.Workload{UID: "se/v4andhost", Name: "v4andhost", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.0.5.1")}, Hostname: "both.example.com",
			Services: map[string]state.PortMap{"ns/v6only.example.com": {80: 80}}}))
		add(b.InsertService(&state.Service{Name: "v6only", Namespace: "ns", Hostname: "v6only.example.com",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.5.3")}}, Ports: state.PortMap{80: 80},
			IPFamilies: state.FamiliesIPv6Only}))
		add(b.InsertWorkload(&state.Workload{UID: "se/v4only", Name: "v4only", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.0.5.2")}, Services: map[string]state.PortMap{"ns/v6only2.example.com": {80: 80}}}))
		add(b.InsertService(&state.Service{Name: "v6only2", Namespace: "ns", Hostname: "v6only2.example.com",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.5.4")}}, Ports: state.PortMap{80: 80},
			IPFamilies: state.FamiliesIPv6Only}))
		add(b.InsertWorkload(&state.Workload{UID: "se/wpdns", Name: "wpdns", Namespace: "ns", ServiceAccount: "wp",
			Hostname: "waypoint.example.com", Protocol: state.TunnelHBONE,
			Services: map[string]state.PortMap{"ns/wpdns.ns.svc.cluster.local": {15008: 15008}}}))
		add(b.InsertService(&state.Service{Name: "wpdns", Namespace: "ns", Hostname: "wpdns.ns.svc.cluster.local",
			Ports: state.PortMap{15008: 15008}}))
		add(b.InsertService(&state.Service{Name: "behind", Namespace: "ns", Hostname: "behind.example.com",
			VIPs: []state.NetworkAddress{{Address: ip("10.96.5.5")}}, Ports: state.PortMap{80: 80},
			Waypoint: &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: "wpdns.ns.svc.cluster.local"},
				HBONEMTLSPort: 15008}}))
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return st.Snapshot()
}

// TestDecideHostnameEndpoint: an endpoint with a hostname and no usable IP
// leaves the route to be resolved (SPEC §3.3): decide names the hostname
// and the family to prefer, and the resolved address completes dial and
// authority as an IP endpoint's would.
func TestDecideHostnameEndpoint(t *testing.T) {
	snap := newHostnameStore(t)
	client := &state.Workload{Namespace: "ns", Name: "client"}
	type want struct {
		Kind, Hostname, Prefer string
		Dial, Authority        string // after setIP(resolved)
		Waypoint               bool
	}
	for _, tc := range []struct {
		name     string
		dst      string
		resolved string
		want     want
		wantErr  error
	}{
		{name: "TCP endpoint by IPv4 VIP", dst: "10.96.5.1:443", resolved: "192.0.2.10", want: want{
			Kind: "TCP", Hostname: "api.example.com", Prefer: "10.96.5.1", Dial: "192.0.2.10:8443"}},
		{name: "TCP endpoint by IPv6 VIP", dst: "[fd00:96::5]:443", resolved: "2001:db8::10", want: want{
			Kind: "TCP", Hostname: "api.example.com", Prefer: "fd00:96::5", Dial: "[2001:db8::10]:8443"}},
		{name: "HBONE endpoint", dst: "10.96.5.2:80", resolved: "192.0.2.11", want: want{
			Kind: "HBONE", Hostname: "mesh.example.com", Prefer: "10.96.5.2", Dial: "192.0.2.11:15008", Authority: "192.0.2.11:8080"}},
		{name: "no IP of the service's family: the hostname is resolved", dst: "10.96.5.3:80", resolved: "2001:db8::12", want: want{
			Kind: "TCP", Hostname: "both.example.com", Prefer: "10.96.5.3", Dial: "[2001:db8::12]:80"}},
		{name: "no IP of the service's family and no hostname", dst: "10.96.5.4:80", wantErr: errNoHealthyUpstream},
		{name: "waypoint with a hostname only", dst: "10.96.5.5:80", resolved: "192.0.2.13", want: want{
			Kind: "HBONE", Hostname: "waypoint.example.com", Prefer: "10.96.5.5", Dial: "192.0.2.13:15008",
			Authority: "10.96.5.5:80", Waypoint: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := router{snap: snap}
			rt, err := r.decide(client, ip("10.0.0.1"), netip.MustParseAddrPort(tc.dst))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("decide(%s) = %+v, %v; want error %v", tc.dst, rt, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decide(%s): %v", tc.dst, err)
			}
			if rt.dial.IsValid() {
				t.Errorf("decide(%s) dial = %v before resolution, want none", tc.dst, rt.dial)
			}
			got := want{Kind: rt.kind.String(), Hostname: rt.hostname, Prefer: rt.prefer.String(), Waypoint: rt.waypoint}
			rt.setIP(ip(tc.resolved))
			got.Dial, got.Authority = rt.dial.String(), rt.authority
			if rt.hostname != "" {
				t.Errorf("setIP left hostname %q", rt.hostname)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decide(%s) then setIP(%s) (-want +got):\n%s", tc.dst, tc.resolved, diff)
			}
		})
	}
}

// TestPickResolved: a resolved address of the original destination's
// family is preferred, at random among them; another family only when the
// answer has no other (ztunnel's resolve_on_demand_dns).
func TestPickResolved(t *testing.T) {
	v4a, v4b, v6a, v6b := ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::1"), ip("2001:db8::2")
	for _, tc := range []struct {
		name  string
		addrs []netip.Addr
		orig  netip.Addr
		want  []string // every address drawn over 200 picks, sorted
	}{
		{"IPv4 client, dual-stack answer", []netip.Addr{v6a, v4a, v6b, v4b}, ip("10.96.0.1"), []string{"192.0.2.1", "192.0.2.2"}},
		{"IPv6 client, dual-stack answer", []netip.Addr{v4a, v6a, v4b, v6b}, ip("fd00::1"), []string{"2001:db8::1", "2001:db8::2"}},
		{"IPv4 client, IPv6-only answer", []netip.Addr{v6a, v6b}, ip("10.96.0.1"), []string{"2001:db8::1", "2001:db8::2"}},
		{"IPv6 client, IPv4-only answer", []netip.Addr{v4a}, ip("fd00::1"), []string{"192.0.2.1"}},
		{"mapped IPv4 counts as IPv4", []netip.Addr{ip("::ffff:192.0.2.3"), v6a}, ip("10.96.0.1"), []string{"192.0.2.3"}},
		{"empty answer", nil, ip("10.96.0.1"), []string{}},
	} {
		r := router{rand: rand.New(rand.NewPCG(3, 4)).Uint64N}
		seen := map[string]bool{}
		for range 200 {
			if a := r.pickResolved(tc.addrs, tc.orig); a.IsValid() {
				seen[a.String()] = true
			}
		}
		got := []string{}
		for a := range seen {
			got = append(got, a)
		}
		slices.Sort(got)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: pickResolved picks (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestSelectIPFamilies: the service's ip_families filter the endpoint's
// addresses before the same-family preference; the original destination
// wins if it is one of them.
func TestSelectIPFamilies(t *testing.T) {
	w := &state.Workload{Addresses: []netip.Addr{ip("10.0.0.5"), ip("fd00::5")}}
	for _, tc := range []struct {
		orig string
		fam  state.IPFamilies
		want string
	}{
		{"10.96.0.1", state.FamiliesAutomatic, "10.0.0.5"},
		{"fd00:96::1", state.FamiliesAutomatic, "fd00::5"},
		{"10.96.0.1", state.FamiliesIPv6Only, "fd00::5"},
		{"fd00:96::1", state.FamiliesIPv4Only, "10.0.0.5"},
		{"10.96.0.1", state.FamiliesDual, "10.0.0.5"},
		{"fd00::5", state.FamiliesIPv4Only, "fd00::5"},
	} {
		var r router
		if got := r.selectIP(w, ip(tc.orig), tc.fam); got.String() != tc.want {
			t.Errorf("selectIP(%s, %v) = %v, want %s", tc.orig, tc.fam, got, tc.want)
		}
	}
}
