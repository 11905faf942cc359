package local

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/rbac"
)

// The Forwarded trust (SPEC §2.5, gozt only): a server behind a waypoint,
// an ordinary client, and the client IP the waypoint forwards for, all on
// loopback addresses of their own /24 in 127.84.0.0/16.
type fwdIPs struct {
	Client, Server, Waypoint, Forwarded string
}

var nextFwdNet atomic.Int32

func newFwdIPs() fwdIPs {
	ip := subnet(84, 10, &nextFwdNet)
	return fwdIPs{Client: ip(2), Server: ip(3), Waypoint: ip(10), Forwarded: ip(9)}
}

const fwdConfig = `
workloads:` + clientWorkload + `- uid: Kubernetes//Pod/demo/waypoint
  name: waypoint
  namespace: demo
  serviceAccount: waypoint
  workloadIps: [{{.Waypoint}}]
  protocol: HBONE` + serverWorkload + `  waypoint: {destination: /{{.Waypoint}}, hboneMtlsPort: 15008}
`

var waypointID = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "waypoint"}

// startFwdMesh starts the mesh above; ignore turns the trust off
// (TRUST_WAYPOINT_FORWARDED=false).
func startFwdMesh(t *testing.T, ignore bool) (*testMesh, fwdIPs) {
	t.Helper()
	ips := newFwdIPs()
	m, logs := startConfig(t, fwdConfig, ips, Options{IgnoreForwarded: ignore})
	return &testMesh{Mesh: m, ips: meshIPs{Client: ips.Client, Server: ips.Server}, logs: logs}, ips
}

// connectAs opens an HBONE connection to the server's 15008 from src with
// id's certificate and sends one CONNECT to the server's 8080 carrying h.
func (tm *testMesh) connectAs(t *testing.T, src string, id identity.Identity, h http.Header) (*hbone.ClientStream, error) {
	t.Helper()
	cert, err := tm.CA().Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	raw, err := d.Dial("tcp", net.JoinHostPort(tm.ips.Server, "15008"))
	if err != nil {
		t.Fatalf("dial 15008 from %s: %v", src, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, certs.ClientConfig(cert, []string{serverID.String()})), hbone.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc.Connect(ctx, net.JoinHostPort(tm.ips.Server, "8080"), h)
}

// sourceSeen round-trips through a CONNECT from src as id with h, and
// returns the source IP the backend saw for it.
func sourceSeen(t *testing.T, tm *testMesh, b *backend, src string, id identity.Identity, h http.Header) string {
	t.Helper()
	before := len(b.accepted())
	s, err := tm.connectAs(t, src, id, h)
	if err != nil {
		t.Fatalf("CONNECT from %s as %s: %v", src, id, err)
	}
	roundTrip(t, s)
	s.Close()
	seen := b.accepted()
	if len(seen) != before+1 {
		t.Fatalf("backend accepted %d connections, want %d", len(seen), before+1)
	}
	host, _, _ := net.SplitHostPort(seen[len(seen)-1])
	return host
}

func forwardedHeader(client string) http.Header {
	return http.Header{"Forwarded": {`for="` + client + `:43210";host=server.demo.svc.cluster.local`}}
}

// TestForwardedFromWaypoint: a CONNECT from the server's waypoint (its
// identity, from its IP) carrying Forwarded for= reaches the backend from
// the forwarded client's IP; the access log shows the waypoint as src.addr
// and the client as src.forwarded, and the metrics' source principal stays
// the waypoint. The same header from an ordinary client, or with the
// waypoint's identity from another IP, changes nothing.
func TestForwardedFromWaypoint(t *testing.T) {
	tm, ips := startFwdMesh(t, false)
	b := listenBackend(t, ips.Server+":8080", echoHandler)
	h := forwardedHeader(ips.Forwarded)

	if got := sourceSeen(t, tm, b, ips.Waypoint, waypointID, h); got != ips.Forwarded {
		t.Errorf("from the waypoint with Forwarded: backend saw %s, want the forwarded %s", got, ips.Forwarded)
	}
	waitLogLine(t, tm, "connection complete", "src.forwarded="+ips.Forwarded+" ", "src.addr="+ips.Waypoint+":")
	metrics := httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics")
	if metricValue(metrics, "istio_tcp_connections_opened_total", `reporter="destination"`, `source_principal="`+waypointID.String()+`"`) < 1 {
		t.Errorf("no destination series with the waypoint as source principal in:\n%s", metrics)
	}
	fwdSample := []string{`source_principal="` + waypointID.String() + `"`}
	if got := metricValue(metrics, "gozt_inbound_forwarded_source_total", fwdSample...); got != 1 {
		t.Errorf("gozt_inbound_forwarded_source_total for the waypoint = %v, want 1", got)
	}

	if got := sourceSeen(t, tm, b, ips.Waypoint, waypointID, nil); got != ips.Waypoint {
		t.Errorf("from the waypoint without Forwarded: backend saw %s, want the waypoint %s", got, ips.Waypoint)
	}
	if got := sourceSeen(t, tm, b, ips.Client, clientID, h); got != ips.Client {
		t.Errorf("from a client with Forwarded: backend saw %s, want the client %s", got, ips.Client)
	}
	if got := sourceSeen(t, tm, b, ips.Client, waypointID, h); got != ips.Client {
		t.Errorf("waypoint identity from the client's IP: backend saw %s, want %s", got, ips.Client)
	}
	if got := sourceSeen(t, tm, b, ips.Waypoint, waypointID, http.Header{"Forwarded": {"for=unknown"}}); got != ips.Waypoint {
		t.Errorf("from the waypoint with for=unknown: backend saw %s, want the waypoint %s", got, ips.Waypoint)
	}
	if strings.Contains(tm.logs.String(), "src.forwarded="+ips.Client) {
		t.Errorf("an untrusted Forwarded reached the access log:\n%s", tm.logs)
	}
	metrics = httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics")
	if got := metricValue(metrics, "gozt_inbound_forwarded_source_total", fwdSample...); got != 1 {
		t.Errorf("after the untrusted headers, gozt_inbound_forwarded_source_total = %v, want still 1", got)
	}
}

// TestForwardedDoesNotChangeAuthorization (TESTPLAN S8): a DENY of the
// waypoint's real address denies its CONNECT whatever client it forwards
// for; a DENY of the forwarded client's address does not, since
// authorization judges the peer. Denied requests reach no backend.
func TestForwardedDoesNotChangeAuthorization(t *testing.T) {
	tm, ips := startFwdMesh(t, false)
	b := listenBackend(t, ips.Server+":8080", echoHandler)
	h := forwardedHeader(ips.Forwarded)
	denySource := func(ip string) *rbac.Policy {
		return &rbac.Policy{Name: "deny-" + ip, Namespace: "demo", Scope: rbac.Namespace, Action: rbac.Deny,
			Rules: []rbac.Rule{{Clauses: []rbac.Clause{{Matches: []rbac.Match{{SourceIPs: []netip.Prefix{netip.MustParsePrefix(ip + "/32")}}}}}}}}
	}

	peerDeny := denySource(ips.Waypoint)
	setPolicy(t, tm.Store(), peerDeny, false)
	s, err := tm.connectAs(t, ips.Waypoint, waypointID, h)
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		if s != nil {
			s.Close()
		}
		t.Fatalf("CONNECT from a denied waypoint = %v, want status 401", err)
	}
	if got := b.accepted(); len(got) != 0 {
		t.Errorf("denied CONNECT reached the backend from %v", got)
	}
	setPolicy(t, tm.Store(), peerDeny, true)

	setPolicy(t, tm.Store(), denySource(ips.Forwarded), false)
	if got := sourceSeen(t, tm, b, ips.Waypoint, waypointID, h); got != ips.Forwarded {
		t.Errorf("with the forwarded client's IP denied: backend saw %s, want %s (authorization judges the peer)", got, ips.Forwarded)
	}
}

// TestForwardedIgnoredWhenOff: with TRUST_WAYPOINT_FORWARDED=false the
// waypoint's Forwarded is ignored, as ztunnel does.
func TestForwardedIgnoredWhenOff(t *testing.T) {
	tm, ips := startFwdMesh(t, true)
	b := listenBackend(t, ips.Server+":8080", echoHandler)
	if got := sourceSeen(t, tm, b, ips.Waypoint, waypointID, forwardedHeader(ips.Forwarded)); got != ips.Waypoint {
		t.Errorf("trust off: backend saw %s, want the waypoint %s", got, ips.Waypoint)
	}
	if strings.Contains(tm.logs.String(), "src.forwarded=") {
		t.Errorf("trust off, yet the access log has src.forwarded:\n%s", tm.logs)
	}
}

// waitLogLine waits up to 5s for one log line containing every one of subs.
func waitLogLine(t *testing.T, tm *testMesh, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(tm.logs.String(), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, s)
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line contains all of %q; logs:\n%s", subs, tm.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
