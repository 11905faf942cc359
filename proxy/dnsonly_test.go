package proxy

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// TestDNSOnly: with DNSOnly (ENABLE_PROXY=false) a proxy binds its DNS
// proxy and none of 15001, 15006, 15008, as ztunnel then runs only the DNS
// server for a workload; without it all three are bound too. Either way
// Listen makes every socket in one entry into the workload's namespace
// (here a Func that counts its calls and runs in the test's own).
func TestDNSOnly(t *testing.T) {
	const ip = "127.88.252.3"
	for _, tc := range []struct {
		dnsOnly bool
		want    int // TCP listeners
	}{
		{false, 3},
		{true, 0},
	} {
		entries := 0
		p, dnsAddr := listenWithDNS(t, ip, func(c *Config) {
			c.DNSOnly = tc.dnsOnly
			c.InNetns = func(fn func(leave func() error) error) error {
				entries++
				return fn(func() error { return nil })
			}
		})
		if entries != 1 {
			t.Errorf("DNSOnly=%v: Listen entered the namespace %d times, want once for all its sockets", tc.dnsOnly, entries)
		}
		if got := len(p.Addrs()); got != tc.want {
			t.Errorf("DNSOnly=%v: %d TCP listeners (%v), want %d", tc.dnsOnly, got, p.Addrs(), tc.want)
		}
		for _, port := range []string{"15001", "15006", "15008"} {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second)
			if bound := err == nil; bound != !tc.dnsOnly {
				t.Errorf("DNSOnly=%v: port %s bound = %v", tc.dnsOnly, port, bound)
			}
			if c != nil {
				c.Close()
			}
		}
		if u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(dnsAddr)); err == nil {
			u.Close()
			t.Errorf("DNSOnly=%v: DNS address %v is not bound", tc.dnsOnly, dnsAddr)
		}
		served := make(chan error, 1)
		go func() { served <- p.Serve() }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p.Shutdown(ctx)
		cancel()
		<-served
	}
}

// listenWithDNS returns a proxy of a workload at ip with a DNS proxy on a
// free port of ip (its address), changed by mod if not nil, and listening.
func listenWithDNS(t *testing.T, ip string, mod func(*Config)) (*Proxy, netip.AddrPort) {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dnsAddr := netip.AddrPortFrom(netip.MustParseAddr(ip), freeUDPPort(t, ip))
	cfg := Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(ip),
		Store: state.NewStore(state.Config{}), Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
		DNS:      dns.NewResolver(dns.Config{Metrics: dns.NewMetrics(prometheus.NewRegistry())}),
		DNSAddrs: []netip.AddrPort{dnsAddr},
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p, dnsAddr
}

// freeUDPPort returns a UDP port free on ip, and most likely on TCP too.
func freeUDPPort(t *testing.T, ip string) uint16 {
	t.Helper()
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	return uint16(u.LocalAddr().(*net.UDPAddr).Port)
}

// TestStartRunsOnlyTheLoops: Start runs a proxy with one goroutine per
// accept or read loop (3 TCP listeners, and the DNS proxy's UDP and TCP
// sockets) and none that only waits, as a node of 110 pods needs; Shutdown
// ends them all.
func TestStartRunsOnlyTheLoops(t *testing.T) {
	p, _ := listenWithDNS(t, "127.88.252.4", nil)
	before, _ := proxyGoroutines()
	p.Start()
	const loops = 3 + 2
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, _ := proxyGoroutines(); got-before >= loops {
			break
		}
	}
	time.Sleep(50 * time.Millisecond) // anything else Start began shows by now
	if got, gotLoops := proxyGoroutines(); got-before != loops || gotLoops != loops {
		t.Errorf("Start added %d goroutines running proxy code, %d of them accept or read loops; want %d, all loops", got-before, gotLoops, loops)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := proxyGoroutines(); got != before {
		t.Errorf("%d goroutines running proxy code after Shutdown, %d before Start", got, before)
	}
}

// proxyGoroutines counts the goroutines whose stacks are in this module's
// proxy packages, and how many of them are accept or read loops (an
// acceptor's loop, a DNS server's readUDP or acceptTCP). Goroutines of the
// runtime, the test framework or idle handler workers are not counted, so
// the count does not move with them.
func proxyGoroutines() (total, loops int) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "gozt/gozt/proxy") {
			continue
		}
		total++
		if strings.Contains(g, "proxy.(*acceptor).loop(") || strings.Contains(g, "dns.(*Server).readUDP(") || strings.Contains(g, "dns.(*Server).acceptTCP(") {
			loops++
		}
	}
	return total, loops
}

// TestInboundOnly: with InboundOnly (the self-proxy of dedicated and shared
// mode) a proxy binds 15008 alone, and no DNS proxy.
func TestInboundOnly(t *testing.T) {
	const ip = "127.88.252.5"
	p, _ := listenWithDNS(t, ip, func(c *Config) { c.InboundOnly, c.EnableSOCKS5 = true, true })
	defer p.Shutdown(context.Background())
	addrs := p.Addrs()
	if in, ok := addrs["inbound"].(*net.TCPAddr); len(addrs) != 1 || !ok || in.Port != InboundPort {
		t.Errorf("InboundOnly listeners %v, want %s:%d alone", addrs, ip, InboundPort)
	}
}
