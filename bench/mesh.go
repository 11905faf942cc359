package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/rbac"
)

// Ports of the setup. The proxies' own ports are gozt's fixed ones.
const (
	appPort   = 9000 // the test server, plain TCP
	appTLS    = 9443 // the test server, mutual TLS
	socksPort = 15080
	hbonePort = 15008
	trustDom  = "cluster.local"

	// relayChainPort and the port after it are the latency scenarios' two
	// relays in a row (twoRelays), on the relay's address.
	relayChainPort = 9100
)

// plan is where everything listens. Every address is a distinct loopback
// IP under one /16 (--net, default 127.55), as each workload has its own
// IP in a pod; Linux routes all of 127/8 to lo.
type plan struct {
	base string // "127.55"

	client  netip.Addr // gozt client workload (outbound proxy, SOCKS5)
	server  netip.Addr // gozt server workload (inbound proxy) and the test server
	rbacSrv netip.Addr // a second server workload, in the namespace with the policies
	other   netip.Addr // a third server workload, in a namespace without policies
	xnetOut netip.Addr
	xnetIn  netip.Addr
	relay   netip.Addr
	haproxy netip.Addr
	plain   netip.Addr // the test server outside the mesh (passthrough)

	// The client and server workloads of the shared-mode proxies, which
	// bind in the harness's network namespace beside the dedicated ones.
	sharedClient netip.Addr
	sharedServer netip.Addr
}

func newPlan(base string) (plan, error) {
	ip := func(c, d int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("%s.%d.%d", base, c, d)) }
	if a, err := netip.ParseAddr(base + ".0.1"); err != nil || !a.IsLoopback() {
		return plan{}, fmt.Errorf("--net %q: want the first two octets of a loopback /16, such as 127.55", base)
	}
	return plan{
		base: base, client: ip(0, 2), server: ip(0, 3), rbacSrv: ip(0, 4),
		xnetOut: ip(0, 5), xnetIn: ip(0, 6), relay: ip(0, 7), haproxy: ip(0, 8), plain: ip(0, 9), other: ip(0, 10),
		sharedClient: ip(0, 11), sharedServer: ip(0, 12),
	}, nil
}

// source is the i-th client source address (i ≥ 1), for connections that
// must not share a pool key.
func (p plan) source(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("%s.1.%d", p.base, i))
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// The workloads and identities of the gozt mesh.
var (
	clientID = identity.Identity{TrustDomain: trustDom, Namespace: "bench", ServiceAccount: "client"}
	serverID = identity.Identity{TrustDomain: trustDom, Namespace: "bench", ServiceAccount: "server"}
)

const (
	clientUID = "bench/client"
	serverUID = "bench/server"
	rbacUID   = "bench-rbac/server"
	rbacNS    = "bench-rbac"
	otherUID  = "bench-other/server"

	// The shared-mode workloads: the same identities as clientUID and
	// serverUID, on addresses of their own.
	sharedClientUID = "bench/client-shared"
	sharedServerUID = "bench/server-shared"
)

// meshConfig is the local config (SPEC §5.5) every gozt process loads.
func (p plan) meshConfig() string {
	var b strings.Builder
	b.WriteString("# Written by gozt bench.\nworkloads:\n")
	for _, w := range []struct {
		uid, ns, sa string
		ip          netip.Addr
	}{
		{clientUID, "bench", "client", p.client},
		{serverUID, "bench", "server", p.server},
		{rbacUID, rbacNS, "server", p.rbacSrv},
		{otherUID, "bench-other", "server", p.other},
		{sharedClientUID, "bench", "client", p.sharedClient},
		{sharedServerUID, "bench", "server", p.sharedServer},
	} {
		name := w.uid[strings.IndexByte(w.uid, '/')+1:]
		fmt.Fprintf(&b, "- uid: %s\n  name: %s\n  namespace: %s\n  serviceAccount: %s\n  trustDomain: %s\n  workloadIps: [%s]\n  protocol: HBONE\n  node: bench\n",
			w.uid, name, w.ns, w.sa, trustDom, w.ip)
	}
	return b.String()
}

// setupCA creates the run's CA in dir (Istio's cacerts layout); every
// process of the run loads it from there.
func setupCA(dir string) (*localca.CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return localca.New(localca.Config{Dir: dir})
}

// issue loads the CA in caDir and issues a certificate for id.
func issue(ctx context.Context, caDir, id string) (*certs.Cert, error) {
	ident, err := identity.Parse(id)
	if err != nil {
		return nil, err
	}
	ca, err := localca.New(localca.Config{Dir: caDir})
	if err != nil {
		return nil, err
	}
	return ca.Issue(ctx, ident)
}

// writeFile writes data to dir/name and returns the path.
func writeFile(dir, name, data string) (string, error) {
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte(data), 0o600)
}

// benchPolicies returns n policies that all apply to every workload of
// namespace ns: namespace-scoped, alternately DENY and ALLOW, each with two
// rules the benchmark client fails (a principal AND a port; a namespace
// prefix AND a source CIDR), except the last, an ALLOW that matches the
// client's service account. So a linear evaluator matches every policy on
// each connection, its worst case for a set of that size (the same shape as
// rbac's own benchmark); rbac's index makes the keyed rules cost nothing.
func benchPolicies(ns string, n int) []*rbac.Policy {
	out := make([]*rbac.Policy, 0, n)
	for i := range n {
		p := &rbac.Policy{Name: fmt.Sprintf("p%05d", i), Namespace: ns, Scope: rbac.Namespace, Action: rbac.Allow}
		if i%2 == 0 {
			p.Action = rbac.Deny
		}
		p.Rules = []rbac.Rule{
			{Clauses: []rbac.Clause{
				{Matches: []rbac.Match{{Principals: []rbac.StringMatch{{Kind: rbac.Exact, Value: fmt.Sprintf("%s/ns/team-%d/sa/web", trustDom, i)}}}}},
				{Matches: []rbac.Match{{DestinationPorts: []uint16{8080, 9090}}}},
			}},
			{Clauses: []rbac.Clause{{Matches: []rbac.Match{{
				Namespaces: []rbac.StringMatch{{Kind: rbac.Prefix, Value: fmt.Sprintf("team-%d", i)}},
				SourceIPs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24)},
			}}}}},
		}
		if i == n-1 {
			p.Action = rbac.Allow
			p.Rules = append(p.Rules, rbac.Rule{Clauses: []rbac.Clause{{Matches: []rbac.Match{{
				ServiceAccounts: []rbac.ServiceAccountMatch{{Namespace: clientID.Namespace, ServiceAccount: clientID.ServiceAccount}},
			}}}}})
		}
		out = append(out, p)
	}
	return out
}
