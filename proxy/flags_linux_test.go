package proxy

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// TestHBONEConnectTimeoutFlag: an HBONE connect that times out is reported
// as ztunnel reports it, "maybe a NetworkPolicy is blocking HBONE port
// 15008", with flag NETWORK_POLICY (SPEC §2.1). The peer is an address
// whose SYNs a DROP rule swallows, inside a namespace of the test's.
func TestHBONEConnectTimeoutFlag(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables")
	ns := nstest.NewNetns(t)
	nstest.Run(t, "ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	nstest.Run(t, "ip", "-n", ns, "addr", "add", "10.9.9.1/24", "dev", "v0")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v0", "up")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v1", "up")
	nstest.Run(t, "ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-d", "10.9.9.9", "-j", "DROP")

	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{
		WorkloadUID: "w", Store: state.NewStore(state.Config{}), Certs: issuedCerts{ca},
		Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
		InNetns: nstest.InNetnsPath("/run/netns/" + ns),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = p.dialHBONE(ctx, hbone.Key{
		SrcIdentity: "spiffe://cluster.local/ns/demo/sa/a",
		Dst:         netip.MustParseAddrPort("10.9.9.9:15008"),
	})
	if err == nil {
		t.Fatal("dial to a black hole succeeded")
	}
	if got := failureFlag(err); got != telemetry.FlagNetworkPolicy || !strings.Contains(err.Error(), "NetworkPolicy is blocking HBONE port 15008") {
		t.Errorf("flag %q, error %q; want NETWORK_POLICY and ztunnel's hint", got, err)
	}
}
