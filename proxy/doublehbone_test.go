package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/syncbuf"
	"github.com/gozt/gozt/internal/tcptest"
	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// The two-network mesh of TestDoubleHBONE: a client on network net-a, and on
// net-b a server behind service echo, reached through an east-west gateway
// of the test's own.
const (
	dhClientIP  = "127.90.0.2"
	dhServerIP  = "127.90.0.3"
	dhGatewayIP = "127.90.0.4"
	dhEchoVIP   = "10.96.90.1"
	dhNoGWVIP   = "10.96.90.2"
	dhBadSANVIP = "10.96.90.3"
	dhEchoHost  = "echo.ns.svc.cluster.local"
	dhNetA      = "net-a"
	dhNetB      = "net-b"
)

var (
	dhServerID  = identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "server"}
	dhGatewayID = identity.Identity{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "eastwest"}
)

// TestDoubleHBONE: a client on one network reaches a service endpoint on
// another through the endpoint's network gateway (SPEC §2.6). The gateway
// sees only the outer CONNECT, for svcHostname:servicePort, and forwards
// an inner TLS session it cannot read; the destination's proxy answers the
// inner CONNECT for the hostname authority, knows from x-forwarded-network
// that the peer address is the gateway's rather than the source's, and the
// client records mutual TLS with the principal of the inner peer. An
// endpoint on another network without a network gateway fails the
// connection.
func TestDoubleHBONE(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction(workers.IdleTop)) }) // first registered, so run last

	app := startEcho(t, dhServerIP)
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := dhStore(t, app.Port())
	gw := startGateway(t, ca, store)

	// The destination's own network describes it in more detail than the
	// client's xDS does: the client's labels must come from the inner 200's
	// baggage, as ztunnel takes them.
	serverStore := dhStore(t, app.Port())
	serverStore.Update(func(b *state.Batch) {
		w := *serverStore.Snapshot().WorkloadByUID("c//Pod/ns/server")
		w.WorkloadName, w.CanonicalName, w.CanonicalRevision, w.ClusterID = "server-remote", "echo-remote", "v2", "cluster-b"
		if err := b.InsertWorkload(&w); err != nil {
			t.Error(err)
		}
	})
	serverLog, serverReg := serveWatchedProxy(t, Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(dhServerIP), InboundOnly: true, Network: dhNetB,
		Store: serverStore, Certs: issuedCerts{ca},
	})
	clientLog, clientReg := serveWatchedProxy(t, Config{
		WorkloadUID: "c//Pod/ns/client", BindAddr: netip.MustParseAddr(dhClientIP), EnableSOCKS5: true, Network: dhNetA,
		Store: store, Certs: issuedCerts{ca},
	})

	// Both directions, twice: the second connection shares the pooled
	// outer HBONE connection, never the inner one.
	const payload = "double-hbone payload 4f1c9e"
	for i := range 2 {
		c := socksConnect(t, netip.MustParseAddrPort(dhEchoVIP+":80"))
		msg := payload + " #" + strconv.Itoa(i)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != msg {
			t.Fatalf("connection %d: echoed %q, %v; want %q", i, got, err, msg)
		}
	}

	gw.mu.Lock()
	authorities, peers, forwarded, dials, networks := gw.authorities, gw.peers, gw.forwarded.Bytes(), gw.dials, gw.networks
	gw.mu.Unlock()
	if len(networks) != 0 {
		t.Errorf("outer CONNECTs carried x-forwarded-network %q, want it only on the inner ones", networks)
	}
	wantAuth := dhEchoHost + ":80"
	if len(authorities) != 2 || authorities[0] != wantAuth || authorities[1] != wantAuth {
		t.Errorf("gateway saw authorities %q, want %q twice", authorities, wantAuth)
	}
	if len(dials) != 1 {
		t.Errorf("gateway accepted %d HBONE connections for 2 CONNECTs, want 1 (the outer connection is pooled)", len(dials))
	}
	if want := "spiffe://cluster.local/ns/ns/sa/client"; len(peers) != 2 || peers[0] != want {
		t.Errorf("gateway saw peers %q, want %q", peers, want)
	}
	if bytes.Contains(forwarded, []byte(payload)) {
		t.Errorf("the gateway forwarded the payload in the clear: the inner stream is not encrypted")
	}
	if len(forwarded) < 2 || forwarded[0] != 0x16 || forwarded[1] != 0x03 {
		t.Errorf("the gateway forwarded % x..., want a TLS handshake record first", forwarded[:min(len(forwarded), 8)])
	}

	waitLog(t, serverLog, "connection complete", 2)
	srv := serverLog.String()
	for _, want := range []string{"dst.hbone_addr=" + wantAuth, "src.identity=spiffe://cluster.local/ns/ns/sa/client", "src.addr=" + dhGatewayIP + ":"} {
		if !strings.Contains(srv, want) {
			t.Errorf("destination access log lacks %q:\n%s", want, srv)
		}
	}
	if strings.Contains(srv, "src.workload=eastwest") {
		// Without x-forwarded-network the gateway's IP names the source.
		t.Errorf("destination took the gateway for the source; x-forwarded-network did not reach it:\n%s", srv)
	}

	waitLog(t, clientLog, "connection complete", 2)
	labels := counterLabels(t, clientReg, "istio_tcp_connections_opened_total", "source")
	for k, want := range map[string]string{
		"connection_security_policy":     "mutual_tls",
		"destination_principal":          dhServerID.String(),
		"destination_workload":           "server-remote",
		"destination_canonical_revision": "v2",
		"destination_app":                "server-remote",
		"destination_cluster":            "cluster-b",
		"destination_service":            dhEchoHost,
		"response_flags":                 "-",
	} {
		if labels[k] != want {
			t.Errorf("client metric label %s = %q, want %q", k, labels[k], want)
		}
	}
	// The source is behind the gateway: its labels are the inner CONNECT's
	// baggage.
	srcLabels := counterLabels(t, serverReg, "istio_tcp_connections_opened_total", "destination")
	for k, want := range map[string]string{
		"source_workload":          "client",
		"source_canonical_service": "client-app",
		"source_cluster":           "cluster-a",
		"source_principal":         "spiffe://cluster.local/ns/ns/sa/client",
	} {
		if srcLabels[k] != want {
			t.Errorf("server metric label %s = %q, want %q", k, srcLabels[k], want)
		}
	}

	// An endpoint on net-b without a network gateway: closed, logged.
	wantClosed(t, netip.MustParseAddrPort(dhNoGWVIP+":80"))
	waitLog(t, clientLog, errNoNetworkGateway.Error(), 1)

	// A service whose SANs do not name the server: the inner handshake
	// fails (the gateway passed it on), recorded as TLS_FAILURE.
	wantClosed(t, netip.MustParseAddrPort(dhBadSANVIP+":80"))
	waitLog(t, clientLog, "inner hbone connect badsan.ns.svc.cluster.local:80", 1)
	if got := counterLabels(t, clientReg, "istio_tcp_connections_failed_total", "source")["response_flags"]; got != telemetry.FlagTLS {
		t.Errorf("inner handshake failure: response_flags = %q, want %q", got, telemetry.FlagTLS)
	}
}

// wantClosed connects to dst through the client proxy and checks the
// connection is reset without a byte: a failed outbound connection must not
// read like an empty answer, even with none of its bytes unread (TESTPLAN 34).
func wantClosed(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	c := socksConnect(t, dst)
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("connection to %s read %d, %v; want it reset", dst, n, err)
	}
}

// TestFromGateway: a CONNECT came through an east-west gateway when its
// first x-forwarded-network differs, ignoring case, from the local network
// (ztunnel's from_gateway); an absent header means it did not.
func TestFromGateway(t *testing.T) {
	for _, tc := range []struct {
		values []string
		local  string
		want   bool
	}{
		{nil, "net-b", false},
		{[]string{"net-b"}, "net-b", false},
		{[]string{"NET-B"}, "net-b", false},
		{[]string{"net-a"}, "net-b", true},
		{[]string{""}, "net-b", true},
		{[]string{""}, "", false},
		{[]string{"net-b", "net-a"}, "net-b", false},
	} {
		if got := fromGateway(tc.values, tc.local); got != tc.want {
			t.Errorf("fromGateway(%q, %q) = %v, want %v", tc.values, tc.local, got, tc.want)
		}
	}
}

// dhStore is the two networks' state, as WDS sends it to every node.
func dhStore(t *testing.T, appPort uint16) *state.Store {
	t.Helper()
	store := state.NewStore(state.Config{})
	gwAddr := &state.GatewayAddress{Address: &state.NetworkAddress{Network: dhNetB, Address: netip.MustParseAddr(dhGatewayIP)}, HBONEMTLSPort: HBONEPort}
	var errs []error
	store.Update(func(b *state.Batch) {
		add := func(err error) { errs = append(errs, err) }
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/client", Name: "client", Namespace: "ns", ServiceAccount: "client",
			WorkloadName: "client", CanonicalName: "client-app", ClusterID: "cluster-a",
			TrustDomain: "cluster.local", Network: dhNetA, Addresses: []netip.Addr{netip.MustParseAddr(dhClientIP)}, Protocol: state.TunnelHBONE}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/server", Name: "server", Namespace: "ns", ServiceAccount: "server",
			TrustDomain: "cluster.local", Network: dhNetB, Addresses: []netip.Addr{netip.MustParseAddr(dhServerIP)}, Protocol: state.TunnelHBONE,
			NetworkGateway: gwAddr, Services: map[string]state.PortMap{"ns/" + dhEchoHost: {80: appPort}, "ns/badsan.ns.svc.cluster.local": {80: appPort}}}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/ns/nogw", Name: "nogw", Namespace: "ns", ServiceAccount: "server",
			TrustDomain: "cluster.local", Network: dhNetB, Addresses: []netip.Addr{netip.MustParseAddr("127.90.0.5")}, Protocol: state.TunnelHBONE,
			Services: map[string]state.PortMap{"ns/nogw.ns.svc.cluster.local": {80: appPort}}}))
		add(b.InsertWorkload(&state.Workload{UID: "c//Pod/istio-system/eastwest", Name: "eastwest", Namespace: "istio-system", ServiceAccount: "eastwest",
			TrustDomain: "cluster.local", Network: dhNetB, Addresses: []netip.Addr{netip.MustParseAddr(dhGatewayIP)}, Protocol: state.TunnelHBONE}))
		add(b.InsertService(&state.Service{Name: "echo", Namespace: "ns", Hostname: dhEchoHost,
			VIPs: []state.NetworkAddress{{Network: dhNetA, Address: netip.MustParseAddr(dhEchoVIP)}}, Ports: state.PortMap{80: appPort},
			SubjectAltNames: []string{dhServerID.String()}}))
		add(b.InsertService(&state.Service{Name: "nogw", Namespace: "ns", Hostname: "nogw.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Network: dhNetA, Address: netip.MustParseAddr(dhNoGWVIP)}}, Ports: state.PortMap{80: appPort},
			SubjectAltNames: []string{dhServerID.String()}}))
		// Its SANs do not name the server: the inner handshake must fail
		// although the gateway's identity is fine.
		add(b.InsertService(&state.Service{Name: "badsan", Namespace: "ns", Hostname: "badsan.ns.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Network: dhNetA, Address: netip.MustParseAddr(dhBadSANVIP)}}, Ports: state.PortMap{80: appPort},
			SubjectAltNames: []string{"spiffe://cluster.local/ns/ns/sa/someone-else"}}))
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return store
}

// eastWest is an east-west gateway for the test: mTLS HBONE on
// gatewayIP:15008 with the gateway's identity; each CONNECT names a service
// hostname and port, and its bytes go unread to the HBONE port of an endpoint
// of that service on the gateway's network.
type eastWest struct {
	store *state.Store
	srv   *hbone.Server

	mu          sync.Mutex
	authorities []string     // each CONNECT's :authority
	peers       []string     // each CONNECT's client identity
	networks    []string     // every x-forwarded-network value the CONNECTs carried
	dials       []string     // each TLS connection's peer address
	forwarded   bytes.Buffer // the first bytes forwarded client to destination
}

func startGateway(t *testing.T, ca *localca.CA, store *state.Store) *eastWest {
	t.Helper()
	cert, err := ca.Issue(context.Background(), dhGatewayID)
	if err != nil {
		t.Fatal(err)
	}
	gw := &eastWest{store: store}
	gw.srv = &hbone.Server{Handler: gw.serve}
	listenHBONE(t, net.JoinHostPort(dhGatewayIP, strconv.Itoa(HBONEPort)), cert, gw.srv, func(c net.Conn) {
		gw.mu.Lock()
		gw.dials = append(gw.dials, c.RemoteAddr().String())
		gw.mu.Unlock()
	})
	return gw
}

// listenHBONE serves srv over mTLS with cert on addr until the test ends;
// accepted, if not nil, sees each connection first.
func listenHBONE(t *testing.T, addr string, cert *certs.Cert, srv *hbone.Server, accepted func(net.Conn)) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tcfg := certs.ServerConfig(func(context.Context) (*certs.Cert, error) { return cert, nil })
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if accepted != nil {
				accepted(c)
			}
			wg.Go(func() { _ = srv.ServeConn(context.Background(), tls.Server(c, tcfg)) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		srv.Close()
		wg.Wait()
	})
}

// serve forwards one CONNECT to the destination's HBONE port, opaquely.
func (gw *eastWest) serve(s *hbone.ServerStream) {
	var peer string
	if tc, ok := s.Conn().(*tls.Conn); ok {
		cs := tc.ConnectionState()
		if id, err := certs.PeerIdentity(&cs); err == nil {
			peer = id.String()
		}
	}
	gw.mu.Lock()
	gw.networks = append(gw.networks, s.Header().Values(headerForwardedNetwork)...)
	gw.authorities = append(gw.authorities, s.Authority())
	gw.peers = append(gw.peers, peer)
	gw.mu.Unlock()
	dst, ok := gw.resolve(s.Authority())
	if !ok {
		_ = s.Respond(http.StatusServiceUnavailable, nil)
		return
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(dhGatewayIP)}}
	up, err := d.Dial("tcp", dst.String())
	if err != nil {
		_ = s.Respond(http.StatusServiceUnavailable, nil)
		return
	}
	defer up.Close()
	defer s.Close()
	if err := s.Respond(http.StatusOK, nil); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(s, up)
		_ = s.CloseWrite()
	}()
	_, _ = io.Copy(up, io.TeeReader(s, gw))
	_ = up.(*net.TCPConn).CloseWrite()
	<-done
}

// Write records the first bytes the gateway forwards toward the destination.
func (gw *eastWest) Write(p []byte) (int, error) {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if room := 64<<10 - gw.forwarded.Len(); room > 0 {
		gw.forwarded.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// resolve maps a hostname:port authority to the HBONE address of an
// endpoint on the gateway's network of the service with that hostname.
func (gw *eastWest) resolve(authority string) (netip.AddrPort, bool) {
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		return netip.AddrPort{}, false
	}
	snap := gw.store.Snapshot()
	for _, svc := range snap.ServicesByHostname(host) {
		for uid := range svc.Endpoints.UIDs() {
			if w := snap.WorkloadByUID(uid); w != nil && w.Network == dhNetB && len(w.Addresses) > 0 {
				return netip.AddrPortFrom(w.Addresses[0], HBONEPort), true
			}
		}
	}
	return netip.AddrPort{}, false
}

// startEcho runs a TCP echo server on ip until the test ends.
func startEcho(t *testing.T, ip string) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	tcptest.Serve(t, l, func(c net.Conn) {
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// socksConnect opens a connection to dst through the client proxy's SOCKS5
// listener, which routes it as the outbound listener would.
func socksConnect(t *testing.T, dst netip.AddrPort) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", net.JoinHostPort(dhClientIP, strconv.Itoa(SOCKS5Port)))
	if err != nil {
		t.Fatal(err)
	}
	ip4 := dst.Addr().As4()
	req := append([]byte{5, 1, 0, 5, 1, 0, 1}, ip4[:]...)
	req = append(req, byte(dst.Port()>>8), byte(dst.Port()))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 12) // method choice, then a 10-byte IPv4 reply
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, reply); err != nil || reply[1] != 0 || reply[3] != socksRepSuccess {
		t.Fatalf("socks5 connect %s: reply % x, %v", dst, reply, err)
	}
	c.SetReadDeadline(time.Time{})
	return c
}

// serveWatchedProxy serves cfg (with a 5s drain) with an access log and a
// metrics registry of its own, and returns both for the test to read.
func serveWatchedProxy(t *testing.T, cfg Config) (*syncbuf.Buffer, *prometheus.Registry) {
	t.Helper()
	log, reg := &syncbuf.Buffer{}, prometheus.NewRegistry()
	cfg.Metrics = telemetry.NewMetrics(reg)
	cfg.AccessLog = slog.New(slog.NewTextHandler(log, nil))
	serveProxy(t, cfg, 5*time.Second)
	return log, reg
}

// waitLog waits until buf holds n lines containing substr.
func waitLog(t *testing.T, buf *syncbuf.Buffer, substr string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(buf.String(), substr) < n {
		if time.Now().After(deadline) {
			t.Fatalf("log has fewer than %d %q lines:\n%s", n, substr, buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counterLabels returns the labels of the series of counter name with
// reporter that has counted something.
func counterLabels(t *testing.T, reg *prometheus.Registry, name, reporter string) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := make(map[string]string)
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["reporter"] == reporter && m.GetCounter().GetValue() > 0 {
				return labels
			}
		}
	}
	t.Fatalf("no %s series with reporter %s", name, reporter)
	return nil
}
