package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/envconfig"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
)

// sharedNode is one gozt in shared mode with the istio-cni side of its ZDS
// socket played by the test.
type sharedNode struct {
	*Node
	name string
	cni  *inpodtest.Server
	zds  *inpodtest.Conn // the current connection from gozt
}

// startShared runs gozt proxy in shared mode with the environment Istio's
// chart gives it (no PROXY_MODE), as node name, fed by the fake istiod, and
// accepts its first ZDS connection.
func (cp *controlPlane) startShared(t *testing.T, name string, extra ...string) *sharedNode {
	t.Helper()
	dir, err := os.MkdirTemp("", "gozt-zds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "ztunnel.sock")
	cni := inpodtest.NewServer(t, sock)
	root := string(cp.ca.RootPEM())
	env, err := envconfig.Load(append([]string{
		"NODE_NAME=" + name,
		"INPOD_UDS=" + sock,
		"XDS_ADDRESS=https://" + cp.xds.Addr(),
		"CA_ADDRESS=https://" + cp.cas.Addr(),
		"XDS_ROOT_CA=" + root,
		"CA_ROOT_CA=" + root,
		"AUTH_TOKEN=node-token",
	}, extra...))
	if err != nil {
		t.Fatal(err)
	}
	if env.ProxyMode != envconfig.ModeShared {
		t.Fatalf("PROXY_MODE unset gave mode %q, want shared", env.ProxyMode)
	}
	opts := Options{Env: env, AdminAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0"}
	if os.Getenv("GOZT_TEST_DEBUG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
	}
	if env.PodName != "" {
		opts.BindAddr = netip.MustParseAddr(selfIP) // the self-proxy's 15008
	}
	return runShared(t, name, cni, opts)
}

// runShared starts gozt with opts as node name, its ZDS served by cni,
// shuts it down when the test ends, and accepts its first ZDS connection.
func runShared(t *testing.T, name string, cni *inpodtest.Server, opts Options) *sharedNode {
	t.Helper()
	n, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("Start %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil && !errors.Is(err, inpod.ErrProtocol) {
			t.Errorf("Shutdown %s: %v", name, err)
		}
	})
	sn := &sharedNode{Node: n, name: name, cni: cni}
	sn.accept(t)
	return sn
}

// accept waits for gozt's next ZDS connection (its hello checked).
func (sn *sharedNode) accept(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sn.cni.Accept(ctx)
	if err != nil {
		t.Fatalf("%s: ZDS accept: %v", sn.name, err)
	}
	sn.zds = c
}

// add hands pod p over as istio-cni does, with its netns fd, and requires a
// successful ack.
func (sn *sharedNode) add(t *testing.T, uid string, p pod, name string) {
	t.Helper()
	f, err := os.Open(p.path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ack, err := sn.zds.Add(uid, inpod.WorkloadInfo{Name: name, Namespace: "demo", ServiceAccount: name}, int(f.Fd()))
	if err != nil || ack != "" {
		t.Fatalf("%s: Add %s = %q, %v", sn.name, uid, ack, err)
	}
}

func (sn *sharedNode) snapshotSent(t *testing.T) {
	t.Helper()
	if ack, err := sn.zds.SnapshotSent(); err != nil || ack != "" {
		t.Fatalf("%s: SnapshotSent = %q, %v", sn.name, ack, err)
	}
}

func (sn *sharedNode) readiness(t *testing.T) string {
	return get(t, "http://"+sn.ReadinessAddr().String()+"/healthz/ready")
}

// meshWorkload is an HBONE workload of namespace demo on node.
func meshWorkload(name, ip, node string) *workloadapi.Workload {
	w := workload(name, ip)
	w.Node = node
	return w
}

// TestSharedModeTraffic: two gozt nodes in shared mode, each serving the
// pods istio-cni hands it, with istio-cni's own redirect rules in every
// captured pod. Pod A reaches B on the other node and C on its own, by pod
// IP and through a service VIP, over HBONE with A's identity and A's IP
// preserved; an uncaptured client reaches B through 15006; a policy denies
// A → B while A → C keeps working; the hostile and loop cases are refused.
func TestSharedModeTraffic(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	m.node(2)
	a, c := m.pod(1, 2, true), m.pod(1, 3, true)
	d := m.pod(1, 4, false) // not in the mesh: no rules, not handed over
	b := m.pod(2, 2, true)
	appB, appC := startApp(t, b, 8080), startApp(t, c, 8080)

	cp := newControlPlane(t)
	n1, n2 := cp.startShared(t, "node1"), cp.startShared(t, "node2")
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"), meshWorkload("b", b.ip, "node2"))
	// A workload of node1 that istio-cni never hands over: gozt asks no
	// certificate for it (docs/differences.md: ztunnel prefetches every
	// local workload's as xDS delivers it).
	cp.xds.PushWorkload(meshWorkload("never-handed", "10.254.0.9", "node1"))
	vip := netip.MustParseAddr("10.96.0.10").As4()
	svc := &workloadapi.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Address: vip[:]}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}
	cp.xds.PushService(svc)
	wb := meshWorkload("b", b.ip, "node2")
	wb.Services = map[string]*workloadapi.PortList{"demo/echo.demo.svc.cluster.local": {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	cp.xds.PushWorkload(wb)

	if r := n1.readiness(t); !strings.Contains(r, blockPods) {
		t.Errorf("readiness before the ZDS snapshot = %q, want it to name %q", r, blockPods)
	}
	n1.add(t, "uid-a", a, "a")
	n1.add(t, "uid-c", c, "c")
	// The snapshot's pods get their certificates once SnapshotSent is
	// acked, not while istio-cni's Adds wait (inpod's AfterAck): before
	// that, no CSR; after it, one for each without any traffic.
	time.Sleep(300 * time.Millisecond)
	if got := csrsFor(cp, "a", "c"); len(got) != 0 {
		t.Errorf("CSRs for %v before SnapshotSent; want none while the snapshot's Adds are answered", got)
	}
	n1.snapshotSent(t)
	eventually(t, 10*time.Second, "CSRs for a and c after SnapshotSent", func() bool { return len(csrsFor(cp, "a", "c")) == 2 })
	n2.add(t, "uid-b", b, "b")
	n2.snapshotSent(t)
	for _, n := range []*sharedNode{n1, n2} {
		eventually(t, 10*time.Second, n.name+" ready", func() bool { return strings.HasPrefix(n.readiness(t), "ready") })
	}

	seed := uint64(1)
	check := func(name string, from pod, to string, app *app, wantSrc string) {
		t.Helper()
		seed++
		conn, err := dialFrom(t, from, to)
		if err != nil {
			t.Errorf("%s: dial %s: %v", name, to, err)
			return
		}
		defer conn.Close()
		if err := exchange(conn, seed, 1<<20); err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		if got := app.last(); got != wantSrc {
			t.Errorf("%s: the app saw source %s, want %s", name, got, wantSrc)
		}
	}
	check("A → B on the other node", a, b.ip+":8080", appB, a.ip)
	check("A → C on the same node", a, c.ip+":8080", appC, a.ip)
	check("A → service VIP → B", a, "10.96.0.10:80", appB, a.ip)
	check("uncaptured D → B through 15006", d, b.ip+":8080", appB, d.ip)

	metrics := get(t, "http://"+n2.MetricsAddr().String()+"/metrics")
	if !hasSeries(metrics, "istio_tcp_connections_opened_total", `reporter="destination"`,
		`source_principal="spiffe://cluster.local/ns/demo/sa/a"`, `destination_workload="b"`, `connection_security_policy="mutual_tls"`) {
		t.Errorf("node2 did not record an mTLS connection from A's identity to B:\n%s", grepLines(metrics, "istio_tcp_connections_opened_total"))
	}
	// The plaintext connection still names B's identity as the destination
	// principal, as ztunnel's inbound passthrough does (SPEC §7.1: from the
	// destination workload's identity; found by make e2e's scenario 3).
	if !hasSeries(metrics, "istio_tcp_connections_opened_total", `reporter="destination"`, `destination_workload="b"`, `connection_security_policy="unknown"`,
		`destination_principal="spiffe://cluster.local/ns/demo/sa/b"`) {
		t.Errorf("node2 did not record the plaintext connection from D:\n%s", grepLines(metrics, "istio_tcp_connections_opened_total"))
	}
	if !strings.Contains(metrics, "workload_manager_active_proxy_count 1") {
		t.Errorf("node2 metrics lack workload_manager_active_proxy_count 1:\n%s", grepLines(metrics, "workload_manager"))
	}

	// Each pod's certificate was asked for on its behalf with the node's
	// token (SPEC §6.2): istiod's ImpersonatedIdentity.
	impersonated := map[string]bool{}
	for _, r := range cp.cas.Requests() {
		if r.HasImpersonated && r.Impersonated == r.Identity.String() && r.Authorization == "Bearer node-token" {
			impersonated[r.Identity.ServiceAccount] = true
		}
	}
	for _, sa := range []string{"a", "b", "c"} {
		if !impersonated[sa] {
			t.Errorf("no impersonated CSR with the node token for pod %s; CA saw %+v", sa, cp.cas.Requests())
		}
	}
	for _, r := range cp.cas.Requests() {
		if r.Identity.ServiceAccount == "never-handed" {
			t.Errorf("a certificate was asked for a workload istio-cni never handed over: %+v", r)
		}
	}

	t.Run("hostile", func(t *testing.T) { sharedHostile(t, cp, n1, a, b, c, d) })

	// A DENY on B's port 8080 stops A → B; A → C keeps working.
	cp.xds.PushPolicy(&security.Authorization{
		Name: "deny-b", Namespace: "demo", Scope: security.Scope_WORKLOAD_SELECTOR, Action: security.Action_DENY,
		Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{DestinationPorts: []uint32{8080}}}}}}},
	})
	wb.AuthorizationPolicies = []string{"demo/deny-b"}
	cp.xds.PushWorkload(wb)
	eventually(t, 5*time.Second, "A → B denied", func() bool {
		conn, err := dialFrom(t, a, b.ip+":8080")
		if err != nil {
			return true
		}
		defer conn.Close()
		return ping(conn) != nil
	})
	check("A → C with B denied", a, c.ip+":8080", appC, a.ip)
}

// sharedHostile: the refusals of SPEC §2.4 and TESTPLAN 59/62 against pod
// proxies in their namespaces.
func sharedHostile(t *testing.T, cp *controlPlane, n1 *sharedNode, a, b, c, d pod) {
	// A pod can neither reach gozt's admin port nor loop through its own
	// capture ports.
	for _, target := range []string{"127.0.0.1:15000", "127.0.0.1:15001", "127.0.0.1:15006", b.ip + ":15006"} {
		conn, err := dialFrom(t, a, target)
		if err != nil {
			continue // refused outright
		}
		if err := ping(conn); err == nil {
			t.Errorf("pod A reached %s and got an echo", target)
		}
		conn.Close()
	}

	// A CONNECT to B's 15008 naming C's IP answers 400; naming B answers 200.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	aID := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "a"}
	cert, err := cp.ca.Issue(ctx, aID)
	if err != nil {
		t.Fatal(err)
	}
	bSAN := []string{"spiffe://cluster.local/ns/demo/sa/b"}
	cc := hboneFrom(t, d, b.ip+":15008", certs.ClientConfig(cert, bSAN))
	defer cc.Close()
	if _, err := cc.Connect(ctx, c.ip+":8080", nil); !isStatus(err, 400) {
		t.Errorf("CONNECT to B naming C = %v, want 400", err)
	}
	s, err := cc.Connect(ctx, b.ip+":8080", nil)
	if err != nil {
		t.Fatalf("CONNECT to B naming B: %v", err)
	}
	if err := ping(s); err != nil {
		t.Errorf("echo through a direct CONNECT: %v", err)
	}
	s.Close()

	// A peer certificate from another trust domain fails the handshake.
	other, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Issue(ctx, identity.Identity{TrustDomain: "evil.example", Namespace: "demo", ServiceAccount: "a"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := certs.ClientConfig(foreign, bSAN)
	cfg.InsecureSkipVerify = true // the server's refusal is what is tested
	cfg.VerifyPeerCertificate = nil
	var raw net.Conn
	inPod(t, d, func() (err error) {
		raw, err = net.DialTimeout("tcp", b.ip+":15008", 5*time.Second)
		return err
	})
	defer raw.Close()
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3: the server's verdict on the client certificate arrives
		// with the first read.
		_, err = tc.Read(make([]byte, 1))
	}
	if err == nil {
		t.Error("a client certificate from another trust domain was accepted")
	}
	_ = n1
}

// hboneFrom opens an HBONE client connection from inside pod p.
func hboneFrom(t *testing.T, p pod, addr string, cfg *tls.Config) *hbone.ClientConn {
	t.Helper()
	var raw net.Conn
	inPod(t, p, func() (err error) {
		raw, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		t.Fatalf("TLS to %s: %v", addr, err)
	}
	cc, err := hbone.NewClientConn(ctx, tc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

func isStatus(err error, code int) bool {
	var se *hbone.StatusError
	return errors.As(err, &se) && se.Code == code
}

// TestSharedModeZDS: the ZDS life cycle against real namespaces. Del drains
// a pod at once; when istio-cni's side goes away gozt is not ready, keeps
// its pods and their open connections, reconnects, and reconciles with the
// next snapshot (a pod not named is drained).
func TestSharedModeZDS(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	a, c, e := m.pod(1, 2, true), m.pod(1, 3, true), m.pod(1, 5, true)
	startApp(t, c, 8080)
	appE := startApp(t, e, 8080)
	cp := newControlPlane(t)
	n1 := cp.startShared(t, "node1")
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"), meshWorkload("e", e.ip, "node1"))
	n1.add(t, "uid-a", a, "a")
	n1.add(t, "uid-c", c, "c")
	n1.add(t, "uid-e", e, "e")
	n1.snapshotSent(t)
	eventually(t, 10*time.Second, "ready", func() bool { return strings.HasPrefix(n1.readiness(t), "ready") })

	// workloadState in /config_dump lists the three pods, Up, with the
	// live connection A → C on both sides.
	live, err := dialFrom(t, a, c.ip+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := ping(live); err != nil {
		t.Fatal(err)
	}
	dump := dumpAt(t, n1.Node)
	for _, uid := range []string{"uid-a", "uid-c", "uid-e"} {
		if st := dump.WorkloadState[uid].State; st != "Up" {
			t.Errorf("workloadState[%s].state = %q, want Up", uid, st)
		}
	}
	if out := dump.WorkloadState["uid-a"].Connections.Outbound; len(out) != 1 || out[0].OriginalDst != c.ip+":8080" || out[0].Protocol != "HBONE" {
		t.Errorf("A's outbound connections = %+v, want one HBONE to %s:8080", out, c.ip)
	}
	if in := dump.WorkloadState["uid-c"].Connections.Inbound; len(in) != 1 || !strings.HasPrefix(in[0].Src, a.ip+":") {
		t.Errorf("C's inbound connections = %+v, want one from %s", in, a.ip)
	}

	// istio-cni goes away: not ready, pods and the open connection stay.
	n1.zds.Close()
	eventually(t, 5*time.Second, "not ready while disconnected", func() bool {
		return strings.Contains(n1.readiness(t), blockPods)
	})
	if err := ping(live); err != nil {
		t.Fatalf("open connection after istio-cni disconnected: %v", err)
	}
	// It comes back: gozt reconnects; the new snapshot names A and C but
	// not E, so E is drained and A, C keep running with the connection.
	n1.accept(t)
	n1.add(t, "uid-a", a, "a")
	n1.add(t, "uid-c", c, "c")
	n1.snapshotSent(t)
	eventually(t, 5*time.Second, "ready after reconnecting", func() bool { return strings.HasPrefix(n1.readiness(t), "ready") })
	if err := ping(live); err != nil {
		t.Fatalf("open connection across the reconnect: %v", err)
	}
	if _, ok := dumpAt(t, n1.Node).WorkloadState["uid-e"]; ok {
		t.Error("pod E, missing from the new snapshot, is still in workloadState")
	}
	before := appE.count()
	if conn, err := dialFrom(t, a, e.ip+":8080"); err == nil {
		if ping(conn) == nil {
			t.Error("E's proxy still served after reconciliation dropped it")
		}
		conn.Close()
	}
	if appE.count() != before {
		t.Error("E's app was reached after its proxy was drained")
	}

	// Del drains C at once: the open connection ends.
	if ack, err := n1.zds.Del("uid-c"); err != nil || ack != "" {
		t.Fatalf("Del = %q, %v", ack, err)
	}
	live.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := live.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("connection to a deleted pod: read = %v, want it closed at once", err)
	}
	for _, st := range n1.Certs().States() {
		if st.Identity.ServiceAccount == "c" || st.Identity.ServiceAccount == "e" {
			t.Errorf("certificate of removed pod %s still held (%s)", st.Identity, st.Status)
		}
	}
	if !strings.Contains(get(t, "http://"+n1.MetricsAddr().String()+"/metrics"), "workload_manager_proxies_stopped_total 2") {
		t.Error("workload_manager_proxies_stopped_total is not 2 after E and C were stopped")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestSocketsStayInTheirNetns: sockets made for many pods from many
// goroutines at once each land in their own pod's namespace, and no
// goroutine is left running on a thread in a pod's namespace.
func TestSocketsStayInTheirNetns(t *testing.T) {
	m := newMeshNet(t)
	self := netnsInodeOfThread(t)
	var pods []pod
	for k := 2; k < 8; k++ {
		pods = append(pods, pod{name: m.netns(fmt.Sprintf("s%d", k))})
	}
	type result struct{ want, got uint64 }
	results := make(chan result, 64*len(pods))
	errs := make(chan error, 64*len(pods))
	done := make(chan struct{})
	for i := 0; i < 64; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			p := pods[i%len(pods)]
			err := nstest.InNetns(p.path(), func() error {
				want := threadNetnsInode()
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return err
				}
				defer l.Close()
				results <- result{want: want, got: socketNetnsInode(l)}
				return nil
			})
			if err != nil {
				errs <- err
			}
			// This goroutine, wherever the scheduler runs it now, is back
			// in the test's namespace.
			if got := threadNetnsInode(); got != self {
				errs <- fmt.Errorf("goroutine left on a thread in netns %d, want %d", got, self)
			}
		}()
	}
	for i := 0; i < 64; i++ {
		<-done
	}
	close(results)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n := 0
	for r := range results {
		n++
		if r.want == self || r.got != r.want {
			t.Errorf("socket in netns %d, made inside netns %d (test's own %d)", r.got, r.want, self)
		}
	}
	if n != 64 {
		t.Errorf("%d sockets checked, want 64", n)
	}
}

// TestPodDialsStayInTheirNetns is TestSocketsStayInTheirNetns for the way
// a pod's proxy dials: sockopt.DialInNetns through netns.Handle.Enter, which
// moves the dialing goroutine's own thread into the pod's namespace and back
// before the connect is waited for. Many goroutines dial listeners on the
// loopbacks of many pods at once; each connection belongs to its pod's
// namespace, reaches that pod's listener, and the goroutine is back in the
// test's namespace afterwards.
func TestPodDialsStayInTheirNetns(t *testing.T) {
	m := newMeshNet(t)
	self := netnsInodeOfThread(t)
	type podNS struct {
		ns    *netns.Handle
		ino   uint64
		addr  netip.AddrPort
		conns chan net.Conn
	}
	var pods []podNS
	for k := 2; k < 8; k++ {
		p := pod{name: m.netns(fmt.Sprintf("d%d", k))}
		ns, err := netns.Open(p.path())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		var ln net.Listener
		if err := ns.Run(func() (err error) { ln, err = net.Listen("tcp4", "127.0.0.1:0"); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		pn := podNS{ns: ns, ino: ns.Inode(), addr: ln.Addr().(*net.TCPAddr).AddrPort(), conns: make(chan net.Conn, 64)}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				pn.conns <- c
			}
		}()
		pods = append(pods, pn)
	}
	const dials = 96
	errs := make(chan error, 2*dials)
	done := make(chan struct{})
	for i := range dials {
		go func() {
			defer func() { done <- struct{}{} }()
			p := pods[i%len(pods)]
			c, err := sockopt.DialInNetns(t.Context(), p.ns.Enter, &net.Dialer{Timeout: 5 * time.Second}, p.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if got, _ := nstest.SocketNetns(c); got != p.ino {
				errs <- fmt.Errorf("connection to %v in netns %d, want the pod's %d", p.addr, got, p.ino)
			}
			if _, err := c.Write([]byte{byte(i)}); err != nil {
				errs <- err
			}
			if got := threadNetnsInode(); got != self {
				errs <- fmt.Errorf("goroutine left on a thread in netns %d, want %d", got, self)
			}
		}()
	}
	for range dials {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every dial reached its own pod's listener: each pod accepted its
	// share, and the byte each sent arrived there.
	for k, p := range pods {
		want := 0
		for i := range dials {
			if i%len(pods) == k {
				want++
			}
		}
		for range want {
			select {
			case c := <-p.conns:
				b := make([]byte, 1)
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(c, b); err != nil || int(b[0])%len(pods) != k {
					t.Errorf("pod %d: read %v, %v; want a byte from one of its own dials", k, b, err)
				}
				c.Close()
			case <-time.After(5 * time.Second):
				t.Fatalf("pod %d accepted fewer than %d connections", k, want)
			}
		}
	}
}

// TestSharedModeUpgrade: a new gozt takes over a node's pods while the old
// one still serves them; both listen in each pod through SO_REUSEPORT
// (INPOD_PORT_REUSE, SPEC §1.3). When the old one shuts down it closes its
// listeners at once and drains, and no new connection fails meanwhile.
func TestSharedModeUpgrade(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	a, c := m.pod(1, 2, true), m.pod(1, 3, true)
	for _, p := range []pod{a, c} {
		// Connections queued on a listener that closes move to its
		// SO_REUSEPORT sibling instead of being reset (Linux ≥ 5.14).
		nstest.Run(m.t, "ip", "netns", "exec", p.name, "sysctl", "-qw", "net.ipv4.tcp_migrate_req=1")
	}
	appC := startApp(t, c, 8080)
	cp := newControlPlane(t)
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"))
	old := cp.startShared(t, "node1")
	old.add(t, "uid-a", a, "a")
	old.add(t, "uid-c", c, "c")
	old.snapshotSent(t)
	eventually(t, 10*time.Second, "old ready", func() bool { return strings.HasPrefix(old.readiness(t), "ready") })
	inFlight, err := dialFrom(t, a, c.ip+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Close()
	if err := ping(inFlight); err != nil {
		t.Fatal(err)
	}

	next := cp.startShared(t, "node1")
	next.add(t, "uid-a", a, "a")
	next.add(t, "uid-c", c, "c")
	next.snapshotSent(t)
	eventually(t, 10*time.Second, "new ready", func() bool { return strings.HasPrefix(next.readiness(t), "ready") })

	// Connections keep being opened while the old gozt drains away.
	stop := make(chan struct{})
	type tally struct{ ok, failed int }
	results := make(chan tally, 1)
	var firstErr error
	go func() {
		var n tally
		for {
			select {
			case <-stop:
				results <- n
				return
			default:
			}
			conn, err := dialFrom(t, a, c.ip+":8080")
			if err == nil {
				err = ping(conn)
				conn.Close()
			}
			if err != nil {
				n.failed++
				if firstErr == nil {
					firstErr = err
				}
			} else {
				n.ok++
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- old.Shutdown(ctx) }()
	// During the drain the connection opened through the old gozt still
	// carries bytes; once it ends, the drain completes by itself (no
	// force-close, which would cut connections the loop opened just before
	// the listeners closed).
	time.Sleep(200 * time.Millisecond)
	if err := ping(inFlight); err != nil {
		t.Errorf("connection through the old gozt during its drain: %v", err)
	}
	inFlight.Close()
	if err := <-shutdownDone; err != nil {
		t.Errorf("old Shutdown (drained, not forced): %v", err)
	}
	time.Sleep(300 * time.Millisecond) // new connections now reach only the new gozt
	close(stop)
	n := <-results
	if n.failed != 0 || n.ok < 10 {
		t.Errorf("during the upgrade %d connections succeeded and %d failed (first: %v); want none failed", n.ok, n.failed, firstErr)
	}
	if appC.count() < n.ok {
		t.Errorf("the app saw %d connections, fewer than the %d that echoed", appC.count(), n.ok)
	}
}

// TestSharedModeProtocolError: a ZDS protocol error (Keep after the
// snapshot, SPEC §9) is NACKed and stops gozt: Done closes and Shutdown
// returns the error, which main turns into exit status 1.
func TestSharedModeProtocolError(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables-restore")
	cp := newControlPlane(t)
	n := cp.startShared(t, "node1")
	n.snapshotSent(t)
	ack, err := n.zds.Keep("uid-late")
	if err != nil || ack == "" {
		t.Fatalf("Keep after SnapshotSent = %q, %v; want a NACK", ack, err)
	}
	select {
	case <-n.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("gozt kept running after a ZDS protocol error")
	}
	if err := n.Shutdown(context.Background()); !errors.Is(err, inpod.ErrProtocol) {
		t.Errorf("Shutdown = %v, want it to carry inpod.ErrProtocol", err)
	}
}

// selfIP is where TestSharedModeSelfProxy's self-proxy listens.
const selfIP = "127.77.0.1"

// TestSharedModeSelfProxy: with POD_NAME, POD_NAMESPACE and SERVICE_ACCOUNT
// set, shared mode serves gozt's own identity on 15008 in its own netns
// after the first xDS sync (SPEC §1.3), and never preserves the client's IP.
func TestSharedModeSelfProxy(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables-restore")
	cp := newControlPlane(t)
	self := meshWorkload("ztunnel-abc", selfIP, "node1")
	self.Namespace, self.ServiceAccount, self.Uid = "istio-system", "ztunnel", "Kubernetes//Pod/istio-system/ztunnel-abc"
	cp.xds.PushWorkload(self)
	n := cp.startShared(t, "node1", "POD_NAME=ztunnel-abc", "POD_NAMESPACE=istio-system", "SERVICE_ACCOUNT=ztunnel")
	n.snapshotSent(t)
	ln, err := net.Listen("tcp", selfIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		io.Copy(c, c)
		c.Close()
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := cp.ca.Issue(ctx, identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var raw net.Conn
	eventually(t, 10*time.Second, "self-proxy listening", func() bool {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: time.Second}
		raw, err = d.Dial("tcp", selfIP+":15008")
		return err == nil
	})
	tc := tls.Client(raw, certs.ClientConfig(client, []string{"spiffe://cluster.local/ns/istio-system/sa/ztunnel"}))
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatalf("TLS with the self-proxy, expecting gozt's own identity: %v", err)
	}
	cc, err := hbone.NewClientConn(ctx, tc, hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, err := cc.Connect(ctx, ln.Addr().String(), nil)
	if err != nil {
		t.Fatalf("CONNECT through the self-proxy: %v", err)
	}
	defer s.Close()
	select {
	case src := <-seen:
		if src == "127.0.0.9" {
			t.Error("the self-proxy preserved the client's source IP; it must never spoof")
		}
	case <-ctx.Done():
		t.Fatal("the self-proxy did not reach the target")
	}

	// SIGTERM drains the self-proxy like the pods' proxies: its open stream
	// keeps working until it ends, and then Shutdown returns.
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	shut := make(chan error, 1)
	go func() { shut <- n.Shutdown(dctx) }()
	time.Sleep(200 * time.Millisecond)
	if err := ping(s); err != nil {
		t.Errorf("stream through the self-proxy during the drain: %v", err)
	}
	s.Close()
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// csrsFor returns which of the service accounts sas the CA has seen a
// request for.
func csrsFor(cp *controlPlane, sas ...string) []string {
	var got []string
	for _, r := range cp.cas.Requests() {
		if slices.Contains(sas, r.Identity.ServiceAccount) && !slices.Contains(got, r.Identity.ServiceAccount) {
			got = append(got, r.Identity.ServiceAccount)
		}
	}
	return got
}
