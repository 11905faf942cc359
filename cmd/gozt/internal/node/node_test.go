package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	xproxy "golang.org/x/net/proxy"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/xds/xdstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop)) }

// controlPlane is a fake istiod: delta xDS and the CA, both over TLS with
// certificates from one local CA.
type controlPlane struct {
	ca  *localca.CA
	xds *xdstest.Server
	cas *istiocatest.Server
}

func newControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stls := istiocatest.ServerTLS(t, ca, "127.0.0.1")
	return &controlPlane{ca: ca, xds: xdstest.NewServer(t, stls), cas: istiocatest.NewServer(t, ca, stls)}
}

// startNode runs a dedicated-mode gozt proxy for demo/<name>/<name> on ip.
func (cp *controlPlane) startNode(t *testing.T, name, ip string) *Node {
	t.Helper()
	return cp.startNodeEnv(t, name, ip)
}

// startNodeEnv is startNode with extra environment variables.
func (cp *controlPlane) startNodeEnv(t *testing.T, name, ip string, extra ...string) *Node {
	t.Helper()
	root := string(cp.ca.RootPEM())
	env, err := envconfig.Load(append([]string{
		"PROXY_MODE=dedicated",
		"PROXY_WORKLOAD_INFO=demo/" + name + "/" + name,
		"XDS_ADDRESS=https://" + cp.xds.Addr(),
		"CA_ADDRESS=https://" + cp.cas.Addr(),
		"XDS_ROOT_CA=" + root,
		"CA_ROOT_CA=" + root,
		"AUTH_TOKEN=test-token",
		"UNSTABLE_ENABLE_SOCKS5=true",
	}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr(ip)
	n, err := Start(context.Background(), Options{
		Env: env, BindAddr: addr, OutboundSource: addr,
		AdminAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatalf("Start %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	})
	return n
}

func workload(name, ip string) *workloadapi.Workload {
	a := netip.MustParseAddr(ip).As4()
	return &workloadapi.Workload{
		Uid: "Kubernetes//Pod/demo/" + name, Name: name, Namespace: "demo", ServiceAccount: name,
		Addresses: [][]byte{a[:]}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}
}

func echo(t *testing.T, addr string) func() []string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return serveEcho(t, ln)
}

// serveEcho echoes every connection ln accepts until the test ends, and
// returns a func listing the clients' addresses so far.
func serveEcho(t *testing.T, ln net.Listener) func() []string {
	var mu sync.Mutex
	var sources []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			sources = append(sources, c.RemoteAddr().String())
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), sources...)
	}
}

// openLive opens a connection through d, a SOCKS5 dialer of a workload, to
// addr and pings it once; the test ends it.
func openLive(t *testing.T, d xproxy.Dialer, addr string) net.Conn {
	t.Helper()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := ping(c); err != nil {
		t.Fatalf("first ping through %s: %v", addr, err)
	}
	return c
}

func ping(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return fmt.Errorf("echo = %q", buf)
	}
	return nil
}

var nextNet = 10

// TestProxyEndToEnd: two dedicated gozt proxies configured only by
// environment variables get their workloads over delta xDS and their
// certificates from the CA; a connection opened before xDS delivers
// anything is carried once it does; a pushed DENY closes it.
func TestProxyEndToEnd(t *testing.T) {
	nextNet++
	clientIP, serverIP := fmt.Sprintf("127.88.%d.2", nextNet), fmt.Sprintf("127.88.%d.3", nextNet)
	cp := newControlPlane(t)
	client := cp.startNode(t, "client", clientIP)
	cp.startNode(t, "server", serverIP)
	sources := echo(t, serverIP+":8080")

	// Nothing is known yet: the SOCKS5 connection is accepted and waits.
	d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	c, err := d.Dial("tcp", serverIP+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(100 * time.Millisecond)
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	if err := ping(c); err != nil {
		t.Fatalf("connection opened before xDS: %v", err)
	}
	if got := sources(); len(got) != 1 || !strings.HasPrefix(got[0], clientIP+":") {
		t.Errorf("backend saw %v, want one connection from %s", got, clientIP)
	}
	ready := get(t, "http://"+client.ReadinessAddr().String()+"/healthz/ready")
	if !strings.HasPrefix(ready, "ready") {
		t.Errorf("readiness after xDS = %q", ready)
	}
	if m := get(t, "http://"+client.MetricsAddr().String()+"/metrics"); !strings.Contains(m, `istio_build{component="ztunnel",tag="unknown"} 1`) {
		t.Errorf("metrics lack istio_build:\n%s", m)
	}
	reqs := cp.cas.Requests()
	if len(reqs) < 2 {
		t.Errorf("CA saw %d requests, want one per identity", len(reqs))
	}

	// A DENY for the client on 8080 closes the live connection.
	cp.xds.PushPolicy(&security.Authorization{
		Name: "deny", Namespace: "demo", Scope: security.Scope_NAMESPACE, Action: security.Action_DENY,
		Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{
			DestinationPorts: []uint32{8080},
		}}}}}},
	})
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection survived a DENY policy")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// socksPing opens a connection through the client's SOCKS5 port and checks
// one echo round trip.
func socksPing(clientIP, target string) error {
	d, err := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	if err != nil {
		return err
	}
	c, err := d.Dial("tcp", target)
	if err != nil {
		return err
	}
	defer c.Close()
	return ping(c)
}
