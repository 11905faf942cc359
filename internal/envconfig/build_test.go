package envconfig

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/state"
)

type fakeCerts struct{}

func (fakeCerts) Get(context.Context, identity.Identity) (*certs.Cert, error) { return nil, nil }

type fakeDemand struct{}

func (fakeDemand) Demand(context.Context, string) error { return nil }

// testServices returns c's services with a store, certificates and an
// on-demand source, and a resolv.conf in a temporary directory.
func testServices(t *testing.T, c Config) Services {
	t.Helper()
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("nameserver 127.0.0.53\nsearch example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.NewServices(Process{Registry: prometheus.NewRegistry(), ResolvConf: rc})
	s.Store, s.Certs, s.Demand = state.NewStore(state.Config{}), fakeCerts{}, fakeDemand{}
	return s
}

func mustLoad(t *testing.T, env []string) Config {
	t.Helper()
	c, err := load(env, "")
	if err != nil {
		t.Fatalf("load(%q): %v", env, err)
	}
	return c
}

// callerFields are the fields of proxy.Config that no variable sets and
// the builder leaves to its callers: shared mode's self-proxy sets
// InboundOnly, and on-demand limits have no variable.
var callerFields = map[string]bool{"InboundOnly": true, "DemandLimits": true}

// TestProxyEveryField: every field of proxy.Config but callerFields is set
// by Config.Proxy in at least one of two environments that between them
// move every variable off its zero; a field the builder dropped, or one
// added to proxy.Config and not mapped, fails here.
func TestProxyEveryField(t *testing.T) {
	envs := [][]string{{
		"ENABLE_ORIG_SRC=true", "UNSTABLE_ENABLE_SOCKS5=true", "NETWORK=net1",
		"TRUST_WAYPOINT_FORWARDED=false", "HBONE_EARLY_DATA=false", "LOCALHOST_APP_TUNNEL=false",
		"USER_TIMEOUT_ENABLED=true", "ENABLE_RESPONSE_BAGGAGE=false", "TLS12_ENABLED=true",
		"AUTHZ_POLICY_INFO_LOGGING=true", "XDS_ON_DEMAND=true", "ISTIO_META_DNS_CAPTURE=false",
	}, {
		"ENABLE_PROXY=false",
	}}
	w := Workload{
		UID:            "uid",
		Local:          func(*state.Snapshot) *state.Workload { return nil },
		BindAddr:       netip.MustParseAddr("127.0.0.2"),
		OutboundSource: netip.MustParseAddr("127.0.0.2"),
		InNetns:        func(fn func(func() error) error) error { return fn(func() error { return nil }) },
	}
	set := map[string]bool{}
	for _, env := range envs {
		c := mustLoad(t, env)
		v := reflect.ValueOf(c.Proxy(testServices(t, c), w))
		for i := range v.NumField() {
			if !v.Field(i).IsZero() {
				set[v.Type().Field(i).Name] = true
			}
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[proxy.Config]()) {
		if !set[f.Name] && !callerFields[f.Name] {
			t.Errorf("Config.Proxy leaves proxy.Config.%s zero in every environment; map it or list it in callerFields", f.Name)
		}
		if set[f.Name] && callerFields[f.Name] {
			t.Errorf("proxy.Config.%s is in callerFields but Config.Proxy sets it", f.Name)
		}
	}
}

// TestProxySettings: each variable reaches its proxy.Config field.
func TestProxySettings(t *testing.T) {
	ka := func(enable bool, idle, interval time.Duration, count int) *net.KeepAliveConfig {
		return &net.KeepAliveConfig{Enable: enable, Idle: idle, Interval: interval, Count: count}
	}
	defKA := ka(true, 180*time.Second, 180*time.Second, 9)
	for _, tc := range []struct {
		name string
		env  []string
		get  func(proxy.Config) any
		want any
	}{
		{"orig src unset", nil, func(p proxy.Config) any { return p.Spoof }, proxy.SpoofAuto},
		{"orig src true", []string{"ENABLE_ORIG_SRC=true"}, func(p proxy.Config) any { return p.Spoof }, proxy.SpoofRequired},
		{"orig src false", []string{"ENABLE_ORIG_SRC=false"}, func(p proxy.Config) any { return p.Spoof }, proxy.SpoofOff},
		{"on demand off", nil, func(p proxy.Config) any { return p.Demand }, nil},
		{"on demand", []string{"XDS_ON_DEMAND=true", "ISTIO_META_DNS_CAPTURE=false"},
			func(p proxy.Config) any { return p.Demand }, fakeDemand{}},
		{"keepalive default", nil, func(p proxy.Config) any { return p.KeepAlive }, defKA},
		{"keepalive", []string{"KEEPALIVE_ENABLED=false", "KEEPALIVE_TIME=1s", "KEEPALIVE_INTERVAL=2s", "KEEPALIVE_RETRIES=3"},
			func(p proxy.Config) any { return p.KeepAlive }, ka(false, time.Second, 2*time.Second, 3)},
		{"user timeout off", []string{"KEEPALIVE_TIME=1s"}, func(p proxy.Config) any { return p.UserTimeout }, time.Duration(0)},
		{"user timeout", []string{"USER_TIMEOUT_ENABLED=true", "KEEPALIVE_TIME=1s", "KEEPALIVE_INTERVAL=2s", "KEEPALIVE_RETRIES=3"},
			func(p proxy.Config) any { return p.UserTimeout }, 7 * time.Second},
		{"tls default", nil, func(p proxy.Config) any { return p.TLS }, certs.Policy{}},
		{"tls 1.2", []string{"TLS12_ENABLED=true"}, func(p proxy.Config) any { return p.TLS }, certs.Policy{TLS12: true}},
		{"pqc", []string{"COMPLIANCE_POLICY=pqc"}, func(p proxy.Config) any { return p.TLS }, certs.Policy{PQC: true}},
		{"hbone", []string{"HTTP2_STREAM_WINDOW_SIZE=1000", "HTTP2_CONNECTION_WINDOW_SIZE=2000", "HTTP2_FRAME_SIZE=20000"},
			func(p proxy.Config) any { return p.HBONE }, hbone.Config{StreamWindow: 1000, ConnWindow: 2000, MaxFrameSize: 20000}},
		{"pool", []string{"POOL_MAX_STREAMS_PER_CONNECTION=7", "POOL_UNUSED_RELEASE_TIMEOUT=9s"},
			func(p proxy.Config) any { return [2]any{p.PoolMaxStreams, p.PoolIdleTimeout} }, [2]any{7, 9 * time.Second}},
		{"mark shared", nil, func(p proxy.Config) any { return p.Mark }, uint32(1337)},
		{"mark", []string{"PACKET_MARK=0x10"}, func(p proxy.Config) any { return p.Mark }, uint32(16)},
		{"forwarded trusted", nil, func(p proxy.Config) any { return p.IgnoreForwarded }, false},
		{"forwarded ignored", []string{"TRUST_WAYPOINT_FORWARDED=false"}, func(p proxy.Config) any { return p.IgnoreForwarded }, true},
		{"early data", []string{"HBONE_EARLY_DATA=false"}, func(p proxy.Config) any { return p.NoEarlyData }, true},
		{"app tunnel", []string{"LOCALHOST_APP_TUNNEL=false"}, func(p proxy.Config) any { return p.AppTunnelToPodIP }, true},
		{"baggage", []string{"ENABLE_RESPONSE_BAGGAGE=false"}, func(p proxy.Config) any { return p.NoResponseBaggage }, true},
		{"authz logging", []string{"AUTHZ_POLICY_INFO_LOGGING=true"}, func(p proxy.Config) any { return p.AuthzInfoLogging }, true},
		{"dns only", []string{"ENABLE_PROXY=false"}, func(p proxy.Config) any { return p.DNSOnly }, true},
		{"socks5 default", nil, func(p proxy.Config) any { return p.EnableSOCKS5 }, false},
		{"socks5", []string{"UNSTABLE_ENABLE_SOCKS5=true"}, func(p proxy.Config) any { return p.EnableSOCKS5 }, true},
		{"network", []string{"NETWORK=n1"}, func(p proxy.Config) any { return p.Network }, "n1"},
		{"list connections", nil, func(p proxy.Config) any { return p.ListConnections }, true},
		{"no dns", []string{"ISTIO_META_DNS_CAPTURE=false"}, func(p proxy.Config) any { return p.DNS == nil }, true},
		{"dns", nil, func(p proxy.Config) any { return p.DNS != nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustLoad(t, tc.env)
			got := tc.get(c.Proxy(testServices(t, c), Workload{UID: "uid"}))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Proxy with %q: (-want +got)\n%s", tc.env, diff)
			}
		})
	}
}

// TestProxyServices: the services reach every proxy unchanged, and the
// per-workload fields come from the Workload.
func TestProxyServices(t *testing.T) {
	c := mustLoad(t, nil)
	s := testServices(t, c)
	ip := netip.MustParseAddr("127.0.0.9")
	p := c.Proxy(s, Workload{UID: "uid", OutboundSource: ip})
	if p.Store != s.Store || p.Certs != s.Certs || p.Metrics != s.Metrics || p.Admission != s.Admission ||
		p.ConnMgr != s.ConnMgr || p.DNS != s.DNS || p.Hosts != s.Hosts || p.Denials != s.Denials {
		t.Errorf("Proxy did not hand on every service: %+v", p)
	}
	if p.WorkloadUID != "uid" || p.OutboundSource != ip || p.Local != nil || p.InNetns != nil || p.ReusePort {
		t.Errorf("Proxy's workload fields = %q %v %v %v, want uid, %v, no netns, no SO_REUSEPORT",
			p.WorkloadUID, p.OutboundSource, p.InNetns != nil, p.ReusePort, ip)
	}
	if p.Logger == nil || p.AccessLog == nil {
		t.Errorf("Proxy's loggers = %v, %v, want the services'", p.Logger, p.AccessLog)
	}
	if p := c.Proxy(Services{}, Workload{UID: "uid"}); p.Logger != nil || p.AccessLog != nil {
		t.Errorf("Proxy without a logger: %v, %v, want nil (discard)", p.Logger, p.AccessLog)
	}
	netns := func(fn func(func() error) error) error { return fn(func() error { return nil }) }
	for env, want := range map[string]bool{"INPOD_PORT_REUSE=true": true, "INPOD_PORT_REUSE=false": false} {
		c := mustLoad(t, []string{env})
		if got := c.Proxy(s, Workload{UID: "uid", InNetns: netns}).ReusePort; got != want {
			t.Errorf("Proxy in a pod's netns with %s: ReusePort = %v, want %v", env, got, want)
		}
	}
}

// TestProxyListenAddrs: a proxy on the unspecified address (a pod's, or
// dedicated mode's) keeps SOCKS5 and the DNS proxy on loopback; one on a
// specific IP keeps them on that IP.
func TestProxyListenAddrs(t *testing.T) {
	ap := netip.MustParseAddrPort
	lo4 := netip.MustParseAddr("127.0.0.1")
	ip := netip.MustParseAddr("127.0.0.7")
	for _, tc := range []struct {
		name      string
		env       []string
		bind      netip.Addr
		wantBind  netip.Addr
		wantSOCKS netip.Addr
		wantDNS   []netip.AddrPort
	}{
		{"default", nil, netip.Addr{}, netip.IPv6Unspecified(), lo4, []netip.AddrPort{ap("127.0.0.1:15053"), ap("[::1]:15053")}},
		{"no ipv6", []string{"IPV6_ENABLED=false"}, netip.Addr{}, netip.IPv4Unspecified(), lo4, []netip.AddrPort{ap("127.0.0.1:15053")}},
		{"unspecified", nil, netip.IPv4Unspecified(), netip.IPv4Unspecified(), lo4, []netip.AddrPort{ap("127.0.0.1:15053"), ap("[::1]:15053")}},
		{"dns addr", []string{"ISTIO_META_DNS_PROXY_ADDR=10.0.0.1:53"}, netip.Addr{}, netip.IPv6Unspecified(), lo4, []netip.AddrPort{ap("10.0.0.1:53")}},
		{"specific", nil, ip, ip, ip, []netip.AddrPort{ap("127.0.0.7:15053")}},
		{"specific dns port", []string{"ISTIO_META_DNS_PROXY_ADDR=localhost:5353"}, ip, ip, ip, []netip.AddrPort{ap("127.0.0.7:5353")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustLoad(t, tc.env)
			p := c.Proxy(Services{}, Workload{UID: "uid", BindAddr: tc.bind})
			if p.BindAddr != tc.wantBind || p.SOCKS5Addr != tc.wantSOCKS {
				t.Errorf("BindAddr, SOCKS5Addr = %v, %v; want %v, %v", p.BindAddr, p.SOCKS5Addr, tc.wantBind, tc.wantSOCKS)
			}
			if diff := cmp.Diff(tc.wantDNS, p.DNSAddrs, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("DNSAddrs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefault: Default is Load's result for an empty environment.
func TestDefault(t *testing.T) {
	want := mustLoad(t, nil)
	if got := Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("Default() = %+v, want %+v", got, want)
	}
}

// TestSocketsInSharedModeOnly: the set where idle listeners park is made
// for shared mode, whose process serves every pod of the node, and handed
// to its proxies; a process of one proxy gets none.
func TestSocketsInSharedModeOnly(t *testing.T) {
	for mode, want := range map[string]bool{ModeShared: true, ModeDedicated: false} {
		c := mustLoad(t, []string{"PROXY_MODE=" + mode, "PROXY_WORKLOAD_INFO=ns/name/sa"})
		s := testServices(t, c)
		if got := s.Sockets != nil; got != want {
			t.Errorf("%s mode: services have a socket set: %v, want %v", mode, got, want)
		}
		if got := c.Proxy(s, Workload{UID: "uid"}).Sockets; got != s.Sockets {
			t.Errorf("%s mode: proxy config's Sockets %p, services' %p", mode, got, s.Sockets)
		}
	}
}
