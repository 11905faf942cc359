package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// The inbound mesh: a server with a service, a waypoint (dual-stack, behind
// a service of its own) and the workloads and services that name it in
// every way a waypoint can be named, workloads with application tunnels,
// hostname services in several namespaces, and one DENY policy per way a
// connection can be denied.
const (
	wpHost  = "waypoint.ns.svc.cluster.local"
	svcHost = "svc.ns.svc.cluster.local"
)

func newInboundStore(t *testing.T) *state.Snapshot {
	t.Helper()
	wpByIP := &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.0.0.10")}, HBONEMTLSPort: 15008}
	wpByVIP := &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.96.0.10")}, HBONEMTLSPort: 15008}
	wpByHost := &state.GatewayAddress{Hostname: &state.NamespacedHostname{Namespace: "ns", Hostname: wpHost}, HBONEMTLSPort: 15008}
	workload := func(name, ns string, ips ...string) *state.Workload {
		w := &state.Workload{UID: "c//Pod/" + ns + "/" + name, Name: name, Namespace: ns, ServiceAccount: name, Protocol: state.TunnelHBONE}
		for _, s := range ips {
			w.Addresses = append(w.Addresses, ip(s))
		}
		return w
	}
	service := func(name, ns, host, vip string, ports state.PortMap) *state.Service {
		s := &state.Service{Name: name, Namespace: ns, Hostname: host, Ports: ports}
		if vip != "" {
			s.VIPs = []state.NetworkAddress{{Address: ip(vip)}}
		}
		return s
	}
	deny := func(name, ns string, ms ...rbac.Match) *rbac.Policy {
		p := &rbac.Policy{Name: name, Namespace: ns, Scope: rbac.Namespace, Action: rbac.Deny}
		for _, m := range ms {
			p.Rules = append(p.Rules, rbac.Rule{Clauses: []rbac.Clause{{Matches: []rbac.Match{m}}}})
		}
		return p
	}

	server := workload("server", "ns", "10.0.0.2")
	server.Services = map[string]state.PortMap{"ns/" + svcHost: {80: 8080}}
	waypoint := workload("waypoint", "ns", "10.0.0.10", "fd00::10")
	waypoint.Services = map[string]state.PortMap{"ns/" + wpHost: {15008: 15008}}
	behindIP, behindVIP, behindHost := workload("behind-ip", "ns", "10.0.0.4"), workload("behind-vip", "ns", "10.0.0.5"), workload("behind-host", "ns", "10.0.0.6")
	behindIP.Waypoint, behindVIP.Waypoint, behindHost.Waypoint = wpByIP, wpByVIP, wpByHost
	tunnel, proxyTunnel, proxyTunnel0, deniedTunnel := workload("tunnel", "ns", "10.0.0.20"), workload("proxy-tunnel", "ns", "10.0.0.21"),
		workload("proxy-tunnel0", "ns", "10.0.0.22"), workload("denied-tunnel", "tun", "10.0.0.23")
	tunnel.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelNone, Port: 15088}
	proxyTunnel.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelProxy, Port: 15088}
	proxyTunnel0.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelProxy}
	deniedTunnel.ApplicationTunnel = &state.ApplicationTunnel{Protocol: state.AppTunnelNone, Port: 15088}
	// Hostname authorities to a PROXY tunnel (SPEC §2.7) name a VIP of the
	// service in the header: services with every mix of VIPs.
	vips := func(s *state.Service, addrs ...string) *state.Service {
		s.VIPs = nil
		for _, a := range addrs {
			network, addr, _ := strings.Cut(a, "/")
			s.VIPs = append(s.VIPs, state.NetworkAddress{Network: network, Address: ip(addr)})
		}
		return s
	}
	tunSvcs := []*state.Service{
		vips(service("tun-mixed", "ns", "tun-mixed.ns.svc.cluster.local", "", state.PortMap{80: 8080}),
			"/fd00::30", "net2/10.99.0.30", "/10.96.0.30", "/10.96.0.31", "/fd00::31"),
		vips(service("tun-v6", "ns", "tun-v6.ns.svc.cluster.local", "", state.PortMap{80: 8080}), "net2/10.99.0.32", "/fd00::32"),
		vips(service("tun-remote", "ns", "tun-remote.ns.svc.cluster.local", "", state.PortMap{80: 8080}), "net2/10.99.0.33", "net3/fd00::33"),
		service("tun-headless", "ns", "tun-headless.ns.svc.cluster.local", "", state.PortMap{80: 8080}),
	}
	proxyTunnel.Services = map[string]state.PortMap{}
	for _, s := range tunSvcs {
		proxyTunnel.Services[s.Key()] = state.PortMap{80: 8080}
	}

	svcWPHost, svcWPIP := service("svc-wp-host", "ns", "svc-wp-host.ns.svc.cluster.local", "10.96.0.4", state.PortMap{80: 8080}),
		service("svc-wp-ip", "ns", "svc-wp-ip.ns.svc.cluster.local", "10.96.0.5", state.PortMap{80: 8080})
	svcWPHost.Waypoint, svcWPIP.Waypoint = wpByHost, wpByIP
	// Endpoints of services with waypoints, for the Forwarded trust
	// (SPEC §2.5): one behind a service waypoint, one behind a weighted one.
	svcWeighted := service("svc-weighted", "ns", "svc-weighted.ns.svc.cluster.local", "10.96.0.7", state.PortMap{80: 8080})
	svcWeighted.WeightedWaypoints = []state.WeightedWaypoint{{Destination: *wpByIP, Weight: 1}}
	behindSvc, behindWeighted := workload("behind-svc", "ns", "10.0.0.7"), workload("behind-weighted", "ns", "10.0.0.8")
	behindSvc.Services = map[string]state.PortMap{"ns/svc-wp-host.ns.svc.cluster.local": {80: 8080}}
	behindWeighted.Services = map[string]state.PortMap{"ns/svc-weighted.ns.svc.cluster.local": {80: 8080}}
	// A Service of another namespace whose EndpointSlice lists a pod of
	// ns (istiod then puts it in the pod's services) and whose waypoint is
	// that namespace's: not a waypoint the pod trusts for Forwarded. Its
	// endpoint behind-foreign also has the ns waypoint on a foreign
	// service, and behind-ip6 is behind-ip's IPv6 twin.
	wpForeign := workload("waypoint", "foreign", "10.0.0.11")
	svcForeign := service("svc-foreign", "foreign", "svc-foreign.foreign.svc.cluster.local", "10.96.0.11", state.PortMap{80: 8080})
	svcForeign.Waypoint = &state.GatewayAddress{Address: &state.NetworkAddress{Address: ip("10.0.0.11")}, HBONEMTLSPort: 15008}
	svcForeignNSWP := service("svc-foreign-nswp", "foreign", "svc-foreign-nswp.foreign.svc.cluster.local", "10.96.0.12", state.PortMap{80: 8080})
	svcForeignNSWP.Waypoint = wpByIP
	behindForeign := workload("behind-foreign", "ns", "10.0.0.9")
	behindForeign.Services = map[string]state.PortMap{svcForeign.Key(): {80: 8080}, svcForeignNSWP.Key(): {80: 8080}}
	behindIP6 := workload("behind-ip6", "ns", "fd00::4")
	behindIP6.Waypoint = wpByIP
	hiddenX := service("hidden", "x", "hidden.example.com", "", state.PortMap{80: 5555})
	hidden2X := service("hidden2", "x", "hidden2.example.com", "", state.PortMap{80: 5555})
	hiddenX.Visibility, hidden2X.Visibility = state.VisibilityNamespace, state.VisibilityNamespace

	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		for _, w := range []*state.Workload{server, workload("other", "ns", "10.0.0.3"), waypoint,
			behindIP, behindVIP, behindHost, behindSvc, behindWeighted, tunnel,
			wpForeign, behindForeign, behindIP6, proxyTunnel, proxyTunnel0, deniedTunnel} {
			errs = append(errs, b.InsertWorkload(w))
		}
		for _, s := range []*state.Service{
			service("svc", "ns", svcHost, "10.96.0.1", state.PortMap{80: 9080, 81: 8181, 82: 0, 83: 15001, 85: 9999}),
			service("waypoint", "ns", wpHost, "10.96.0.10", state.PortMap{15008: 15008}),
			svcWPHost, svcWPIP, svcWeighted, svcForeign, svcForeignNSWP,
			service("no-wp", "ns", "no-wp.ns.svc.cluster.local", "10.96.0.6", state.PortMap{80: 8080}),
			service("dup", "a", "dup.example.com", "", state.PortMap{80: 1111}),
			service("dup", "ns", "dup.example.com", "", state.PortMap{80: 2222}),
			service("far", "b", "far.example.com", "", state.PortMap{80: 3333}),
			service("far", "c", "far.example.com", "", state.PortMap{80: 4444}),
			hiddenX, hidden2X,
			service("hidden2", "y", "hidden2.example.com", "", state.PortMap{80: 6666}),
			tunSvcs[0], tunSvcs[1], tunSvcs[2], tunSvcs[3],
		} {
			errs = append(errs, b.InsertService(s))
		}
		errs = append(errs,
			b.InsertPolicy(deny("deny", "ns",
				rbac.Match{DestinationPorts: []uint16{9999}},
				rbac.Match{Namespaces: []rbac.StringMatch{{Kind: rbac.Exact, Value: "evil"}}},
				rbac.Match{SourceIPs: []netip.Prefix{netip.MustParsePrefix("10.66.0.0/16")}})),
			b.InsertPolicy(deny("deny-tunnel-port", "tun", rbac.Match{DestinationPorts: []uint16{15088}})))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return st.Snapshot()
}

// connectCase is one CONNECT for decideConnect. Empty fields take the
// common values: method CONNECT, the local workload's first IP as L3
// destination, a peer at 10.0.0.3 with identity ns/client.
type connectCase struct {
	name      string
	local     string // the local workload's name in namespace ns, or "-" for none
	method    string
	authority string
	l3dst     string
	src       string
	srcNS     string // the peer identity's namespace
	srcSA     string // the peer identity's service account, or "-" for no identity
	forwarded string // the request's Forwarded for= IP
	socks5    bool   // 15080 is an illegal port too

	want    string // the upstream, when decided (accepted or denied)
	wantPP  string // the PROXY header's destination, or "" for no PROXY tunnel
	wantFwd string // the trusted forwarded client, or ""
	wantSvc string // the service key the decision names, or ""
	status  int    // non-zero when refused
	flag    string
	err     error
}

func runConnectCases(t *testing.T, cases []connectCase) {
	t.Helper()
	snap := newInboundStore(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.query(t, snap)
			d, ierr := decideConnect(&q)
			if tc.status != 0 {
				if ierr == nil {
					t.Fatalf("decideConnect(%s %s) = %v, want status %d", q.method, q.authority, d.upstream, tc.status)
				}
				got := []any{ierr.status, ierr.flag, errors.Is(ierr, tc.err)}
				if diff := cmp.Diff([]any{tc.status, tc.flag, true}, got); diff != "" {
					t.Errorf("decideConnect(%s %s) = %v; (status, flag, is %v) mismatch (-want +got):\n%s", q.method, q.authority, ierr, tc.err, diff)
				}
			} else if ierr != nil {
				t.Fatalf("decideConnect(%s %s) = %v, want %s", q.method, q.authority, ierr, tc.want)
			}
			tc.checkDecision(t, &q, d)
		})
	}
}

func (tc *connectCase) query(t *testing.T, snap *state.Snapshot) connectQuery {
	t.Helper()
	q := connectQuery{snap: snap, illegal: illegalPorts{OutboundPort, PlaintextPort, InboundPort},
		method: http.MethodConnect, authority: tc.authority, src: netip.MustParseAddrPort("10.0.0.3:40000"),
		srcID: identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "client"}}
	if tc.socks5 {
		q.illegal[3] = SOCKS5Port
	}
	if tc.local != "-" {
		q.local = snap.WorkloadByUID("c//Pod/ns/" + tc.local)
		if q.local == nil {
			q.local = snap.WorkloadByUID("c//Pod/tun/" + tc.local)
		}
		if q.local == nil {
			t.Fatalf("no workload %q", tc.local)
		}
		q.l3dst = netip.AddrPortFrom(q.local.Addresses[0], InboundPort)
	}
	if tc.method != "" {
		q.method = tc.method
	}
	if tc.l3dst != "" {
		q.l3dst = netip.MustParseAddrPort(tc.l3dst)
	}
	if tc.src != "" {
		q.src = netip.MustParseAddrPort(tc.src)
	}
	if tc.srcNS != "" {
		q.srcID.Namespace = tc.srcNS
	}
	switch tc.srcSA {
	case "":
	case "-":
		q.srcID = identity.Identity{}
	default:
		q.srcID.ServiceAccount = tc.srcSA
	}
	if tc.forwarded != "" {
		q.forwardedFor = netip.MustParseAddr(tc.forwarded)
	}
	return q
}

// checkDecision checks what the decision records: the upstream and what
// authorization saw once decided, the local workload only past steps 1–2.
func (tc *connectCase) checkDecision(t *testing.T, q *connectQuery, d connectDecision) {
	t.Helper()
	type view struct {
		Upstream, Service, Forwarded, ProxyDst string
		Local                                  bool
		Authz                                  string // rbac.Conn, which cmp cannot look into
	}
	want := view{Service: tc.wantSvc, Forwarded: tc.wantFwd, ProxyDst: tc.wantPP, Local: q.local != nil && !errors.Is(tc.err, errNotConnect) && !errors.Is(tc.err, errBadAuthority)}
	if tc.want != "" {
		want.Upstream = tc.want
		want.Authz = fmt.Sprint(rbac.Conn{Src: q.src, Dst: netip.MustParseAddrPort(tc.want), Identity: q.srcID})
	}
	got := view{Local: d.local != nil}
	if d.upstream.IsValid() {
		got.Upstream = d.upstream.String()
	}
	if d.service != nil {
		got.Service = d.service.Key()
	}
	if d.forwarded.IsValid() {
		got.Forwarded = d.forwarded.String()
	}
	if d.proxyDst.IsValid() {
		got.ProxyDst = d.proxyDst.String()
	}
	if d.authz != (rbac.Conn{}) {
		got.Authz = fmt.Sprint(d.authz)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decideConnect(%s %s) decision mismatch (-want +got):\n%s", q.method, q.authority, diff)
	}
}

// TestDecideConnectRequest: SPEC §2.4 steps 1–2, a CONNECT to ip:port or
// hostname:port, else 400.
func TestDecideConnectRequest(t *testing.T) {
	runConnectCases(t, []connectCase{
		{name: "ip authority", local: "server", authority: "10.0.0.2:8080", want: "10.0.0.2:8080"},
		{name: "mapped ip authority", local: "server", authority: "[::ffff:10.0.0.2]:8080", want: "10.0.0.2:8080"},
		{name: "hostname authority", local: "server", authority: svcHost + ":80", want: "10.0.0.2:8080", wantSvc: "ns/" + svcHost},
		{name: "GET", local: "server", method: http.MethodGet, authority: "10.0.0.2:8080", status: 400, flag: telemetry.FlagConnect, err: errNotConnect},
		{name: "lower-case connect", local: "server", method: "connect", authority: "10.0.0.2:8080", status: 400, flag: telemetry.FlagConnect, err: errNotConnect},
		{name: "method before local workload", local: "-", method: http.MethodPost, authority: "10.0.0.2:8080", status: 400, flag: telemetry.FlagConnect, err: errNotConnect},
		{name: "empty authority", local: "server", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "ip without port", local: "server", authority: "10.0.0.2", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "hostname without port", local: "server", authority: svcHost, status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "port 0", local: "server", authority: "10.0.0.2:0", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "ipv6 zone", local: "server", authority: "[fe80::1%eth0]:80", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "bad hostname", local: "server", authority: "bad host:80", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
		{name: "authority before local workload", local: "-", authority: "10.0.0.2", status: 400, flag: telemetry.FlagConnect, err: errBadAuthority},
	})
}

// TestDecideConnectLocalWorkload: SPEC §2.4 step 3, no local workload is 503.
func TestDecideConnectLocalWorkload(t *testing.T) {
	runConnectCases(t, []connectCase{
		{name: "ip authority", local: "-", authority: "10.0.0.2:8080", l3dst: "10.0.0.2:15008", status: 503, flag: telemetry.FlagConnect, err: errNoLocalWorkload},
		{name: "hostname authority", local: "-", authority: svcHost + ":80", l3dst: "10.0.0.2:15008", status: 503, flag: telemetry.FlagConnect, err: errNoLocalWorkload},
	})
}

// TestDecideConnectDestination: SPEC §2.4 step 4 as implemented: an IP
// authority other than the L3 destination is allowed only for a local
// workload with an application tunnel or that is the target's waypoint,
// else 400; hostname authorities are not checked.
func TestDecideConnectDestination(t *testing.T) {
	runConnectCases(t, []connectCase{
		{name: "other workload", local: "server", authority: "10.0.0.3:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		{name: "unknown ip", local: "server", authority: "192.0.2.1:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		{name: "service vip without waypoint", local: "server", authority: "10.96.0.6:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		{name: "own service vip", local: "server", authority: "10.96.0.1:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		{name: "hostname is not checked", local: "other", authority: svcHost + ":80", want: "10.0.0.3:9080", wantSvc: "ns/" + svcHost},
		{name: "application tunnel", local: "tunnel", authority: "192.0.2.1:80", want: "10.0.0.20:15088"},
		{name: "workload waypoint by ip", local: "waypoint", authority: "10.0.0.4:80", want: "10.0.0.10:80"},
		{name: "workload waypoint by hostname", local: "waypoint", authority: "10.0.0.6:80", want: "10.0.0.10:80"},
		{name: "service waypoint by hostname", local: "waypoint", authority: "10.96.0.4:80", want: "10.0.0.10:80"},
		{name: "service waypoint by ip", local: "waypoint", authority: "10.96.0.5:80", want: "10.0.0.10:80"},
		{name: "waypoint of another workload", local: "server", authority: "10.0.0.4:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		{name: "waypoint by hostname, not an endpoint", local: "server", authority: "10.96.0.4:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
		// The waypoint address is resolved to its workload or service, as
		// ztunnel does (issue 12, item 2; these were refused with 400): a
		// waypoint named by its service VIP, one reached on its other IP.
		{name: "workload waypoint by vip", local: "waypoint", authority: "10.0.0.5:80", want: "10.0.0.10:80"},
		{name: "waypoint reached on its other ip", local: "waypoint", authority: "10.0.0.4:80", l3dst: "[fd00::10]:15008", want: "[fd00::10]:80"},
		{name: "waypoint vip, not an endpoint", local: "server", authority: "10.0.0.5:80", status: 400, flag: telemetry.FlagConnect, err: errIPMismatch},
	})
}

// TestDecideConnectTarget: SPEC §2.4 step 5. The upstream is the L3
// destination IP; a hostname's port comes from the endpoint's mapping, else
// the service's; no service or port, or an illegal port, is 503; an
// application tunnel replaces the port.
func TestDecideConnectTarget(t *testing.T) {
	runConnectCases(t, []connectCase{
		{name: "ip port kept", local: "server", authority: "10.0.0.2:1234", want: "10.0.0.2:1234"},
		{name: "endpoint port mapping", local: "server", authority: svcHost + ":80", want: "10.0.0.2:8080", wantSvc: "ns/" + svcHost},
		{name: "service target port", local: "server", authority: svcHost + ":81", want: "10.0.0.2:8181", wantSvc: "ns/" + svcHost},
		{name: "named target port", local: "server", authority: svcHost + ":82", wantSvc: "ns/" + svcHost, status: 503, flag: telemetry.FlagConnect, err: errNoTargetPort},
		{name: "undeclared service port", local: "server", authority: svcHost + ":84", wantSvc: "ns/" + svcHost, status: 503, flag: telemetry.FlagConnect, err: errNoTargetPort},
		{name: "unknown hostname", local: "server", authority: "nope.example.com:80", status: 503, flag: telemetry.FlagConnect, err: errNoService},
		{name: "local namespace preferred", local: "server", authority: "dup.example.com:80", want: "10.0.0.2:2222", wantSvc: "ns/dup.example.com"},
		{name: "first namespace otherwise", local: "server", authority: "far.example.com:80", want: "10.0.0.2:3333", wantSvc: "b/far.example.com"},
		{name: "namespace-visible elsewhere", local: "server", authority: "hidden.example.com:80", status: 503, flag: telemetry.FlagConnect, err: errNoService},
		{name: "public over namespace-visible", local: "server", authority: "hidden2.example.com:80", want: "10.0.0.2:6666", wantSvc: "y/hidden2.example.com"},
		{name: "ip to 15008", local: "server", authority: "10.0.0.2:15008", status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "ip to 15001", local: "server", authority: "10.0.0.2:15001", status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "ip to 15006", local: "server", authority: "10.0.0.2:15006", status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "15080 without socks5", local: "server", authority: "10.0.0.2:15080", want: "10.0.0.2:15080"},
		{name: "15080 with socks5", local: "server", authority: "10.0.0.2:15080", socks5: true, status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "hostname to an illegal port", local: "server", authority: svcHost + ":83", wantSvc: "ns/" + svcHost, status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "tunnel port", local: "tunnel", authority: "10.0.0.20:8080", want: "10.0.0.20:15088"},
		{name: "illegal port before tunnel", local: "tunnel", authority: "10.0.0.20:15006", status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
	})
}

// TestDecideConnectProxyTunnel: SPEC §2.7 as ztunnel decides it. A PROXY
// tunnel's upstream is its port (the resolved one when it has none), and
// the header names the IP authority as given, or for a hostname a VIP of
// its service: IPv4 on this network, else IPv6 there, else another
// network's, the last of equals; a service without VIPs is 503. NONE only
// replaces the port.
func TestDecideConnectProxyTunnel(t *testing.T) {
	const h = ".ns.svc.cluster.local"
	runConnectCases(t, []connectCase{
		{name: "ip authority", local: "proxy-tunnel", authority: "10.0.0.21:8080", want: "10.0.0.21:15088", wantPP: "10.0.0.21:8080"},
		{name: "no tunnel port", local: "proxy-tunnel0", authority: "10.0.0.22:8080", want: "10.0.0.22:8080", wantPP: "10.0.0.22:8080"},
		{name: "other ip authority", local: "proxy-tunnel", authority: "192.0.2.1:80", want: "10.0.0.21:15088", wantPP: "192.0.2.1:80"},
		{name: "ipv6 authority", local: "proxy-tunnel", authority: "[2001:db8::1]:80", want: "10.0.0.21:15088", wantPP: "[2001:db8::1]:80"},
		{name: "mapped authority", local: "proxy-tunnel", authority: "[::ffff:192.0.2.1]:80", want: "10.0.0.21:15088", wantPP: "192.0.2.1:80"},
		{name: "no identity", local: "proxy-tunnel", authority: "10.0.0.21:8080", srcSA: "-", want: "10.0.0.21:15088", wantPP: "10.0.0.21:8080"},
		{name: "hostname, local ipv4 vip", local: "proxy-tunnel", authority: "tun-mixed" + h + ":80", want: "10.0.0.21:15088", wantSvc: "ns/tun-mixed" + h, wantPP: "10.96.0.31:80"},
		{name: "hostname, local ipv6 vip", local: "proxy-tunnel", authority: "tun-v6" + h + ":80", want: "10.0.0.21:15088", wantSvc: "ns/tun-v6" + h, wantPP: "[fd00::32]:80"},
		{name: "hostname, remote vips only", local: "proxy-tunnel", authority: "tun-remote" + h + ":80", want: "10.0.0.21:15088", wantSvc: "ns/tun-remote" + h, wantPP: "[fd00::33]:80"},
		{name: "hostname, no vip", local: "proxy-tunnel", authority: "tun-headless" + h + ":80", wantSvc: "ns/tun-headless" + h, status: 503, flag: telemetry.FlagConnect, err: errNoServiceVIP},
		{name: "illegal port before tunnel", local: "proxy-tunnel", authority: "10.0.0.21:15008", status: 503, flag: telemetry.FlagConnect, err: errSelfCall},
		{name: "none: port only", local: "tunnel", authority: "10.0.0.20:8080", want: "10.0.0.20:15088"},
	})
}

// TestDecideConnectAuthorization: SPEC §2.4 step 6, the local workload's
// policies see the HBONE peer, its identity and the resolved upstream; a
// deny is 401 with flag DENY.
func TestDecideConnectAuthorization(t *testing.T) {
	runConnectCases(t, []connectCase{
		{name: "allowed", local: "server", authority: "10.0.0.2:8080", want: "10.0.0.2:8080"},
		{name: "denied port", local: "server", authority: "10.0.0.2:9999", want: "10.0.0.2:9999", status: 401, flag: telemetry.FlagDeny, err: errDenied},
		{name: "denied resolved port", local: "server", authority: svcHost + ":85", want: "10.0.0.2:9999", wantSvc: "ns/" + svcHost, status: 401, flag: telemetry.FlagDeny, err: errDenied},
		{name: "denied identity", local: "server", authority: "10.0.0.2:8080", srcNS: "evil", want: "10.0.0.2:8080", status: 401, flag: telemetry.FlagDeny, err: errDenied},
		{name: "denied peer address", local: "server", authority: "10.0.0.2:8080", src: "10.66.0.1:40000", want: "10.0.0.2:8080", status: 401, flag: telemetry.FlagDeny, err: errDenied},
		{name: "denied tunnel port", local: "denied-tunnel", authority: "10.0.0.23:8080", want: "10.0.0.23:15088", status: 401, flag: telemetry.FlagDeny, err: errDenied},
	})
}

// TestDecideConnectForwarded: SPEC §2.5 as gozt does it. The Forwarded
// for= IP becomes the upstream source only when the peer is the local
// workload's waypoint, named in any way a waypoint can be (its IP, its
// service's VIP or hostname, the waypoint of a service the workload is an
// endpoint of, a weighted waypoint), by both the identity and the IP of the
// waypoint workload; and only for an IP that can be a source toward the
// pod. Authorization always sees the real peer (checkDecision's Authz).
func TestDecideConnectForwarded(t *testing.T) {
	const wp, client = "10.0.0.10:40000", "10.0.0.3:40000"
	runConnectCases(t, []connectCase{
		{name: "workload waypoint by ip", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.4:8080", wantFwd: "192.0.2.9"},
		{name: "workload waypoint by vip", local: "behind-vip", authority: "10.0.0.5:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.5:8080", wantFwd: "192.0.2.9"},
		{name: "workload waypoint by hostname", local: "behind-host", authority: "10.0.0.6:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.6:8080", wantFwd: "192.0.2.9"},
		{name: "service waypoint", local: "behind-svc", authority: "10.0.0.7:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.7:8080", wantFwd: "192.0.2.9"},
		{name: "weighted service waypoint", local: "behind-weighted", authority: "10.0.0.8:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.8:8080", wantFwd: "192.0.2.9"},
		{name: "hostname authority", local: "behind-svc", authority: "svc-wp-host.ns.svc.cluster.local:80", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.7:8080", wantSvc: "ns/svc-wp-host.ns.svc.cluster.local", wantFwd: "192.0.2.9"},
		{name: "no header", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", want: "10.0.0.4:8080"},

		{name: "ordinary client", local: "behind-ip", authority: "10.0.0.4:8080", src: client, forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "waypoint identity elsewhere", local: "behind-ip", authority: "10.0.0.4:8080", src: client, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "waypoint ip, other identity", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "waypoint ip, other namespace", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", srcNS: "other", forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "waypoint ip, no identity", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "-", forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "unknown peer ip", local: "behind-ip", authority: "10.0.0.4:8080", src: "192.0.2.200:40000", srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.4:8080"},
		{name: "not this workload's waypoint", local: "server", authority: "10.0.0.2:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.2:8080"},
		// Services of another namespace that list the pod (istiod adds them
		// from that namespace's EndpointSlices): their waypoints, even one
		// that is also a waypoint of ns, are not the pod's.
		{name: "foreign service's waypoint", local: "behind-foreign", authority: "10.0.0.9:8080", src: "10.0.0.11:40000", srcNS: "foreign", srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.9:8080"},
		{name: "ns waypoint of a foreign service", local: "behind-foreign", authority: "10.0.0.9:8080", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.9:8080"},
		{name: "ipv6 waypoint", local: "behind-ip6", authority: "[fd00::4]:8080", src: "[fd00::10]:40000", srcSA: "waypoint", forwarded: "2001:db8::9", want: "[fd00::4]:8080", wantFwd: "2001:db8::9"},

		{name: "other family", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "2001:db8::9", want: "10.0.0.4:8080"},
		{name: "loopback toward a pod", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "127.0.0.9", want: "10.0.0.4:8080"},
		{name: "unspecified", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "0.0.0.0", want: "10.0.0.4:8080"},
		{name: "multicast", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "224.0.0.1", want: "10.0.0.4:8080"},
		{name: "broadcast", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "255.255.255.255", want: "10.0.0.4:8080"},
		{name: "link-local", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "169.254.0.9", want: "10.0.0.4:8080"},
		// The kubelet-probe addresses istio-cni's rules let through
		// unauthenticated (SPEC §1.4) are never a forwarded source.
		{name: "ipv4 kubelet probe address", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "169.254.7.127", want: "10.0.0.4:8080"},
		{name: "ipv6 kubelet probe address", local: "behind-ip6", authority: "[fd00::4]:8080", src: "[fd00::10]:40000", srcSA: "waypoint", forwarded: "fd16:9254:7127:1337:ffff:ffff:ffff:ffff", want: "[fd00::4]:8080"},

		// RBAC: the forwarded client is not the source it judges.
		{name: "forwarded from a denied range", local: "behind-ip", authority: "10.0.0.4:8080", src: wp, srcSA: "waypoint", forwarded: "10.66.0.1", want: "10.0.0.4:8080", wantFwd: "10.66.0.1"},
		{name: "denied port, still forwarded", local: "behind-ip", authority: "10.0.0.4:9999", src: wp, srcSA: "waypoint", forwarded: "192.0.2.9", want: "10.0.0.4:9999", wantFwd: "192.0.2.9", status: 401, flag: telemetry.FlagDeny, err: errDenied},
		{name: "ordinary client in the denied range", local: "behind-ip", authority: "10.0.0.4:8080", src: "10.66.0.1:40000", forwarded: "192.0.2.9", want: "10.0.0.4:8080", status: 401, flag: telemetry.FlagDeny, err: errDenied},
	})
}

// TestDecideConnectNoAllocs: an accepted CONNECT to an IP authority is
// decided without allocating (STYLE 38). A hostname authority allocates
// the two errors of parseAuthority's failed netip parses.
func TestDecideConnectNoAllocs(t *testing.T) {
	snap := newInboundStore(t)
	for _, tc := range []connectCase{
		{local: "server", authority: "10.0.0.2:8080"},
		{local: "waypoint", authority: "10.96.0.4:80"},
		{local: "tunnel", authority: "192.0.2.1:80"},
		{local: "proxy-tunnel", authority: "192.0.2.1:80"},
		{local: "behind-svc", authority: "10.0.0.7:8080", src: "10.0.0.10:40000", srcSA: "waypoint", forwarded: "192.0.2.9"},
		{local: "behind-host", authority: "10.0.0.6:8080", src: "10.0.0.3:40000", srcSA: "waypoint", forwarded: "192.0.2.9"},
	} {
		q := tc.query(t, snap)
		if n := testing.AllocsPerRun(100, func() {
			if _, ierr := decideConnect(&q); ierr != nil {
				t.Fatal(ierr)
			}
		}); n != 0 {
			t.Errorf("decideConnect(%s) allocates %v times, want 0", tc.authority, n)
		}
	}
}

// TestGuessService: the service named in metrics (SPEC §7.1) is the
// Forwarded host's if the workload belongs to it, else the first by key of
// the workload's services whose target port is the destination port.
func TestGuessService(t *testing.T) {
	st := state.NewStore(state.Config{})
	var errs []error
	st.Update(func(b *state.Batch) {
		errs = append(errs, b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/server", Name: "server", Namespace: "ns",
			Addresses: []netip.Addr{ip("10.0.0.2")}, Protocol: state.TunnelHBONE,
			Services: map[string]state.PortMap{"ns/a.ns": {80: 8080}, "ns/b.ns": {81: 8080}, "ns/c.ns": {82: 8080}, "ns/named.ns": {80: 0}, "other/x.other": {90: 9090}}}))
		for _, s := range []*state.Service{
			{Name: "a", Namespace: "ns", Hostname: "a.ns", Ports: state.PortMap{80: 8080}},
			{Name: "b", Namespace: "ns", Hostname: "b.ns", Ports: state.PortMap{81: 8080}},
			{Name: "c", Namespace: "ns", Hostname: "c.ns", Ports: state.PortMap{82: 8080}},
			{Name: "named", Namespace: "ns", Hostname: "named.ns", Ports: state.PortMap{80: 7070}},
			{Name: "x", Namespace: "other", Hostname: "x.other", Ports: state.PortMap{90: 9090}},
			{Name: "stranger", Namespace: "ns", Hostname: "stranger.ns", Ports: state.PortMap{80: 8080}},
		} {
			errs = append(errs, b.InsertService(s))
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	snap := st.Snapshot()
	local := snap.WorkloadByUID("c//Pod/ns/server")
	for _, tc := range []struct {
		host string
		port uint16
		want string
	}{
		{"b.ns", 1, "ns/b.ns"},
		{"x.other", 1, "other/x.other"},
		{"stranger.ns", 8080, "ns/a.ns"},
		{"", 8080, "ns/a.ns"},
		{"", 7070, "ns/named.ns"},
		{"", 9090, "other/x.other"},
		{"", 1, ""},
	} {
		got := ""
		if svc := guessService(snap, local, tc.host, tc.port); svc != nil {
			got = svc.Key()
		}
		if got != tc.want {
			t.Errorf("guessService(%q, %d) = %q, want %q", tc.host, tc.port, got, tc.want)
		}
	}
}
