package node

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

// fwdMesh is the tier-3 mesh of the Forwarded trust (SPEC §2.5): one node
// in shared mode serving captured pod B, whose waypoint is pod W; pod A is
// the client W forwards for and pod D an ordinary peer. W, A and D are not
// captured: the test plays the waypoint and the peers from inside their
// namespaces.
type fwdMesh struct {
	cp      *controlPlane
	node    *sharedNode
	a, b, d pod
	w       pod
	appB    *app
	wb      *workloadapi.Workload
}

func startFwdMesh(t *testing.T, extraEnv ...string) *fwdMesh {
	t.Helper()
	m := newMeshNet(t)
	m.node(1)
	fm := &fwdMesh{b: m.pod(1, 2, true), a: m.pod(1, 3, false), w: m.pod(1, 4, false), d: m.pod(1, 5, false)}
	fm.appB = startApp(t, fm.b, 8080)
	fm.cp = newControlPlane(t)
	fm.node = fm.cp.startShared(t, "node1", extraEnv...)
	wpIP := netip.MustParseAddr(fm.w.ip).As4()
	fm.wb = meshWorkload("b", fm.b.ip, "node1")
	fm.wb.Waypoint = &workloadapi.GatewayAddress{
		Destination:   &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: wpIP[:]}},
		HboneMtlsPort: 15008,
	}
	fm.cp.xds.PushWorkload(meshWorkload("waypoint", fm.w.ip, "node2"), meshWorkload("a", fm.a.ip, "node2"), fm.wb)
	fm.node.add(t, "uid-b", fm.b, "b")
	fm.node.snapshotSent(t)
	eventually(t, 10*time.Second, "node1 ready", func() bool { return strings.HasPrefix(fm.node.readiness(t), "ready") })
	return fm
}

// sourceVia CONNECTs from inside pod from, with id's certificate, to B's
// 8080 carrying Forwarded for= A's IP, exchanges bytes through B's app and
// returns the source the app saw, or "" and the error of a refused CONNECT
// or a failed exchange.
func (fm *fwdMesh) sourceVia(t *testing.T, from pod, id identity.Identity) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cert, err := fm.cp.ca.Issue(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	cc := hboneFrom(t, from, fm.b.ip+":15008", certs.ClientConfig(cert, []string{"spiffe://cluster.local/ns/demo/sa/b"}))
	defer cc.Close()
	h := http.Header{"Forwarded": {`for="` + fm.a.ip + `:43210"`}}
	s, err := cc.Connect(ctx, fm.b.ip+":8080", h)
	if err != nil {
		return "", err
	}
	defer s.Close()
	if err := exchange(s, 7, 256<<10); err != nil {
		return "", fmt.Errorf("exchange through B from %s as %s: %w", from.ip, id, err)
	}
	return fm.appB.last(), nil
}

var (
	fwdWaypointID = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "waypoint"}
	fwdClientID   = identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "a"}
)

// TestSharedModeForwardedFromWaypoint: in shared mode, inside B's netns with
// istio-cni's rules, a CONNECT from B's waypoint carrying Forwarded for= A's
// IP reaches B's app from A's IP. A itself is a live pod on the same bridge
// that never opened that connection, so the exchange completes only if B's
// replies to the spoofed source are routed back to gozt by the mark rules.
// From an ordinary peer, or with the waypoint's identity from another pod,
// the header is ignored; a DENY of the waypoint's own address still denies.
func TestSharedModeForwardedFromWaypoint(t *testing.T) {
	fm := startFwdMesh(t)
	// Until xDS has delivered B and its waypoint, the CONNECT fails or the
	// waypoint's source is kept; from then on A's is used.
	eventually(t, 10*time.Second, "B's app to see A's IP through the waypoint", func() bool {
		src, err := fm.sourceVia(t, fm.w, fwdWaypointID)
		return err == nil && src == fm.a.ip
	})
	if src, err := fm.sourceVia(t, fm.d, fwdClientID); err != nil || src != fm.d.ip {
		t.Errorf("ordinary peer with Forwarded: app saw %q (%v), want the peer %s", src, err, fm.d.ip)
	}
	if src, err := fm.sourceVia(t, fm.d, fwdWaypointID); err != nil || src != fm.d.ip {
		t.Errorf("waypoint identity from pod D: app saw %q (%v), want the peer %s", src, err, fm.d.ip)
	}

	wp := netip.MustParseAddr(fm.w.ip).As4()
	fm.cp.xds.PushPolicy(&security.Authorization{
		Name: "deny-waypoint-ip", Namespace: "demo", Scope: security.Scope_WORKLOAD_SELECTOR, Action: security.Action_DENY,
		Groups: []*security.Group{{Rules: []*security.Rules{{Matches: []*security.Match{{SourceIps: []*security.Address{{Address: wp[:], Length: 32}}}}}}}},
	})
	fm.wb.AuthorizationPolicies = []string{"demo/deny-waypoint-ip"}
	fm.cp.xds.PushWorkload(fm.wb)
	eventually(t, 10*time.Second, "the waypoint's address denied", func() bool {
		_, err := fm.sourceVia(t, fm.w, fwdWaypointID)
		return isStatus(err, http.StatusUnauthorized)
	})
	after := fm.appB.count()
	if _, err := fm.sourceVia(t, fm.w, fwdWaypointID); !isStatus(err, http.StatusUnauthorized) {
		t.Errorf("CONNECT from the denied waypoint = %v, want 401", err)
	}
	if n := fm.appB.count(); n != after {
		t.Errorf("a denied CONNECT reached B's app (%d → %d connections)", after, n)
	}
}

// TestSharedModeForwardedOff: with TRUST_WAYPOINT_FORWARDED=false the
// waypoint's Forwarded is ignored, as ztunnel does: B's app sees the
// waypoint.
func TestSharedModeForwardedOff(t *testing.T) {
	fm := startFwdMesh(t, "TRUST_WAYPOINT_FORWARDED=false")
	// Wait until xDS has delivered B's waypoint, so that ignoring the header
	// is the switch's doing: the waypoint's HBONE peer is known as a
	// workload once the metrics name it as source.
	eventually(t, 10*time.Second, "the waypoint known to node1", func() bool {
		src, err := fm.sourceVia(t, fm.w, fwdWaypointID)
		if err != nil {
			return false // B not delivered yet
		}
		if src != fm.w.ip {
			t.Fatalf("trust off: app saw %s, want the waypoint %s", src, fm.w.ip)
		}
		metrics := get(t, "http://"+fm.node.MetricsAddr().String()+"/metrics")
		return hasSeries(metrics, "istio_tcp_connections_opened_total", `reporter="destination"`, `source_workload="waypoint"`, `destination_workload="b"`)
	})
	if src, err := fm.sourceVia(t, fm.w, fwdWaypointID); err != nil || src != fm.w.ip {
		t.Errorf("trust off: app saw %q (%v), want the waypoint %s", src, err, fm.w.ip)
	}
}
