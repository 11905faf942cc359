package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/internal/envconfig"
)

// TestOwnCertsOnly: a dedicated proxy may hold only its own workload's
// certificate; asking for another identity fails locally and the CA sees no
// request for it (TESTPLAN S11, bad input 51).
func TestOwnCertsOnly(t *testing.T) {
	nextNet++
	ip := fmt.Sprintf("127.88.%d.2", nextNet)
	cp := newControlPlane(t)
	n := cp.startNode(t, "client", ip)
	cp.xds.PushWorkload(workload("client", ip))
	own := ownCerts{certs: n.certs, store: n.store, local: n.findLocal}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for n.findLocal(n.store.Snapshot()) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	self := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	if _, err := own.Get(ctx, self); err != nil {
		t.Fatalf("own identity: %v", err)
	}
	other := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "server"}
	if _, err := own.Get(ctx, other); !errors.Is(err, errForeignIdentity) {
		t.Errorf("foreign identity: err = %v, want %v", err, errForeignIdentity)
	}
	for _, r := range cp.cas.Requests() {
		if r.Identity == other {
			t.Errorf("the CA was asked for %s", other)
		}
	}
}

// TestXDSDownAfterWarmUp (TESTPLAN F2): once workloads are known, the data
// plane keeps working while istiod is unreachable.
func TestXDSDownAfterWarmUp(t *testing.T) {
	nextNet++
	clientIP, serverIP := fmt.Sprintf("127.88.%d.2", nextNet), fmt.Sprintf("127.88.%d.3", nextNet)
	cp := newControlPlane(t)
	cp.startNode(t, "client", clientIP)
	cp.startNode(t, "server", serverIP)
	echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Fatalf("warm-up connection: %v", err)
	}
	cp.xds.Blackhole(true)
	cp.xds.CloseStreams(status.Error(codes.Unavailable, "istiod going away"))
	for i := range 5 {
		if err := socksPing(clientIP, serverIP+":8080"); err != nil {
			t.Fatalf("connection %d with xDS down: %v", i, err)
		}
	}
}

// TestXDSDownAtStart (TESTPLAN F1): with istiod unreachable the listeners
// accept but forward nothing and readiness names the state manager; once
// xDS answers, the node turns ready and carries traffic.
func TestXDSDownAtStart(t *testing.T) {
	nextNet++
	clientIP, serverIP := fmt.Sprintf("127.88.%d.2", nextNet), fmt.Sprintf("127.88.%d.3", nextNet)
	cp := newControlPlane(t)
	cp.xds.Blackhole(true)
	client := cp.startNode(t, "client", clientIP)
	cp.startNode(t, "server", serverIP)
	sources := echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))

	readyURL := "http://" + client.ReadinessAddr().String() + "/healthz/ready"
	if got := get(t, readyURL); !strings.Contains(got, "not ready, pending: state manager") {
		t.Errorf("readiness with xDS down = %q, want not ready on the state manager", got)
	}
	if err := socksPing(clientIP, serverIP+":8080"); err == nil {
		t.Error("traffic was forwarded before xDS delivered any workload")
	}
	if got := sources(); len(got) != 0 {
		t.Errorf("backend reached %d times with xDS down", len(got))
	}

	cp.xds.Blackhole(false)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.HasPrefix(get(t, readyURL), "ready") {
		if time.Now().After(deadline) {
			t.Fatal("never ready after xDS came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Errorf("traffic once xDS arrived: %v", err)
	}
}

// TestSOCKS5OnLoopbackOnly: the unauthenticated SOCKS5 listener binds
// 127.0.0.1, as ztunnel's does, in both modes; only tests that give each
// dedicated proxy its own loopback IP move it there (issue 14, defect 2).
func TestSOCKS5OnLoopbackOnly(t *testing.T) {
	for _, mode := range []string{"PROXY_MODE=shared", "PROXY_MODE=dedicated"} {
		env, err := envconfig.Load([]string{mode, "PROXY_WORKLOAD_INFO=ns/name/sa", "UNSTABLE_ENABLE_SOCKS5=true"})
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{opts: Options{Env: env}, log: slog.New(slog.DiscardHandler)}
		cfg := n.proxyConfig(envconfig.Workload{})
		if got := cfg.SOCKS5Addr; got != netip.MustParseAddr("127.0.0.1") || !cfg.EnableSOCKS5 {
			t.Errorf("%s: SOCKS5 binds %v (enabled %v), want 127.0.0.1", mode, got, cfg.EnableSOCKS5)
		}
	}
}

// TestStartFailureAfterListen: a start-up error after some listeners bound
// (the admin port taken, or a missing root-cert file) is one line naming
// its cause, with no crash and the workload ports left free (issue 14,
// defect 1: the deferred cleanup used to run on a nil *Node).
func TestStartFailureAfterListen(t *testing.T) {
	cp := newControlPlane(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	bind := netip.MustParseAddr("127.88.250.2")
	for _, tc := range []struct {
		name, root, admin, want string
	}{
		{"admin port taken", string(cp.ca.RootPEM()), taken.Addr().String(), taken.Addr().String()},
		{"root certificate missing", "/nonexistent/root-cert.pem", "127.0.0.1:0", "XDS_ROOT_CA"},
	} {
		env, err := envconfig.Load([]string{
			"PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=demo/w/w",
			"XDS_ADDRESS=https://" + cp.xds.Addr(), "CA_ADDRESS=https://" + cp.cas.Addr(),
			"XDS_ROOT_CA=" + tc.root, "CA_ROOT_CA=" + string(cp.ca.RootPEM()),
		})
		if err != nil {
			t.Fatal(err)
		}
		n, err := Start(context.Background(), Options{
			Env: env, BindAddr: bind, AdminAddr: tc.admin, MetricsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0",
		})
		if err == nil {
			n.Shutdown(context.Background())
			t.Fatalf("%s: Start succeeded", tc.name)
		}
		if n != nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: Start = %v, %v; want nil and one line naming %s", tc.name, n, err, tc.want)
		}
		l, err := net.Listen("tcp", bind.String()+":15001")
		if err != nil {
			t.Errorf("%s: 15001 still bound after the failed start: %v", tc.name, err)
			continue
		}
		l.Close()
	}
}
