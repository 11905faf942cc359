package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/proxy/telemetry"
)

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// liveInputForTest is a node with one workload and its certificate, more
// connections than the view lists, one denial, and all three control-plane
// links.
func liveInputForTest(t *testing.T) (LiveInput, *certs.Cert) {
	t.Helper()
	ca, err := localca.New(localca.Config{TTL: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "server"}
	cert, err := ca.Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	in := LiveInput{
		Mode:        "shared",
		ConnsListed: true,
		Workloads: []LiveWorkload{{UID: "uid-server", Name: "server", Namespace: "demo", Identity: id,
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.3")}, State: "Up"}},
		Certs:      []certs.State{{Identity: id, Status: certs.StatusAvailable, Cert: cert}},
		ConnsTotal: LiveConnLimit + 7,
		Denials: []telemetry.Denial{{Time: start, Workload: "demo/server", WorkloadUID: "uid-server", Via: telemetry.ViaHBONE,
			Src: netip.MustParseAddrPort("10.0.0.2:4000"), SrcIdentity: "spiffe://cluster.local/ns/demo/sa/client",
			Dst: netip.MustParseAddrPort("10.0.0.3:8080"), Policy: "demo/deny", Rule: 2, Reason: "denied by policy demo/deny rule 2"}},
		DenialsTotal: 9,
		XDS:          NewLink("https://istiod:15012", true, start, ""),
		CA:           NewLink("https://istiod:15012", false, start, "connection refused"),
		ZDS:          NewLink("/var/run/ztunnel/ztunnel.sock", false, time.Time{}, ""),
	}
	for i := range LiveConnLimit + 5 {
		in.Conns = append(in.Conns, telemetry.LiveConn{
			ConnJSON:  telemetry.ConnJSON{Src: fmt.Sprintf("10.0.0.2:%d", 40000+i), OriginalDst: "10.0.0.3:8080", ActualDst: "10.0.0.3:15008", Protocol: "HBONE"},
			Direction: "outbound", Start: start.Add(time.Duration(LiveConnLimit+5-i) * time.Second),
			SrcIdentity: "spiffe://cluster.local/ns/demo/sa/client", RequestBytes: int64(i), ResponseBytes: 2 * int64(i), BytesLive: true,
		})
	}
	return in, cert
}

// TestLiveJSONShape: /debug/live has the documented keys at every level,
// the certificate's expiry, connections capped at LiveConnLimit (oldest
// first) with the total, the denial's policy and rule, every link's state,
// and nothing secret.
func TestLiveJSONShape(t *testing.T) {
	in, cert := liveInputForTest(t)
	s, err := ListenAdmin(context.Background(), "127.82.0.1:0", Config{Live: func() LiveInput { return in }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	code, body, hdr := do(t, "GET", "http://"+s.Addr().String()+"/debug/live", nil)
	if code != 200 || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /debug/live = %d %q", code, hdr.Get("Content-Type"))
	}
	for _, secret := range []string{"PRIVATE", "BEGIN", "pem", "token", "Bearer"} {
		if strings.Contains(body, secret) {
			t.Errorf("/debug/live contains %q:\n%s", secret, body)
		}
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/debug/live is not JSON: %v\n%s", err, body)
	}
	check := func(what string, m any, want ...string) map[string]any {
		t.Helper()
		mm, ok := m.(map[string]any)
		if !ok {
			t.Fatalf("%s is %T, want an object", what, m)
		}
		if diff := cmp.Diff(want, keys(mm)); diff != "" {
			t.Errorf("%s keys (-want +got):\n%s", what, diff)
		}
		return mm
	}
	check("live", v, "connections", "controlPlane", "denials", "mode", "time", "workloads")
	if v["mode"] != "shared" {
		t.Errorf("mode = %v, want shared", v["mode"])
	}
	if _, err := time.Parse(time.RFC3339Nano, v["time"].(string)); err != nil {
		t.Errorf("time %v: %v", v["time"], err)
	}

	w := check("workloads[0]", v["workloads"].([]any)[0], "addresses", "certificate", "identity", "name", "namespace", "state", "uid")
	if w["identity"] != "spiffe://cluster.local/ns/demo/sa/server" {
		t.Errorf("workload identity = %v", w["identity"])
	}
	c := check("certificate", w["certificate"], "expirationTime", "serialNumber", "state", "validFrom")
	if want := cert.Chain()[0].NotAfter.UTC().Format(time.RFC3339); c["expirationTime"] != want || c["state"] != "Available" {
		t.Errorf("certificate = %v, want Available expiring %s", c, want)
	}

	conns := check("connections", v["connections"], "listed", "shown", "total")
	shown := conns["shown"].([]any)
	if len(shown) != LiveConnLimit || conns["total"] != float64(LiveConnLimit+7) || conns["listed"] != true {
		t.Errorf("connections: %d shown of %v (listed %v), want %d of %d", len(shown), conns["total"], conns["listed"], LiveConnLimit, LiveConnLimit+7)
	}
	first := check("connections.shown[0]", shown[0], "actualDst", "bytesLive", "direction", "originalDst", "protocol",
		"requestBytes", "responseBytes", "src", "srcIdentity", "start")
	// Oldest first: the last input connection started first.
	if first["src"] != fmt.Sprintf("10.0.0.2:%d", 40000+LiveConnLimit+4) || first["requestBytes"] != float64(LiveConnLimit+4) {
		t.Errorf("first connection shown = %v, want the oldest", first)
	}

	den := check("denials", v["denials"], "recent", "total")
	d := check("denials.recent[0]", den["recent"].([]any)[0], "dst", "policy", "reason", "rule", "src", "srcIdentity", "time", "via", "workload", "workloadUid")
	if d["policy"] != "demo/deny" || d["rule"] != float64(2) || den["total"] != float64(9) || d["src"] != "10.0.0.2:4000" {
		t.Errorf("denials = %v", den)
	}

	cp := check("controlPlane", v["controlPlane"], "ca", "xds", "zds")
	for name, want := range map[string]string{"xds": LinkConnected, "ca": LinkDisconnected, "zds": LinkConnecting} {
		if got := cp[name].(map[string]any)["state"]; got != want {
			t.Errorf("controlPlane.%s.state = %v, want %s", name, got, want)
		}
	}
	check("controlPlane.ca", cp["ca"], "address", "lastError", "since", "state")
}

// TestLivePage: / serves the embedded page, which polls /debug/live and
// loads nothing from elsewhere; without a Live func /debug/live is 404.
func TestLivePage(t *testing.T) {
	s, err := ListenAdmin(context.Background(), "127.82.0.1:0", Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	base := "http://" + s.Addr().String()
	code, body, hdr := do(t, "GET", base+"/", nil)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") || !strings.Contains(body, `fetch("/debug/live"`) {
		t.Errorf("GET / = %d %q, want the live page", code, hdr.Get("Content-Type"))
	}
	for _, external := range []string{"http://", "https://", "src=\"//"} {
		if strings.Contains(body, external) {
			t.Errorf("the live page refers to %q: it must work offline", external)
		}
	}
	if code, _, _ := do(t, "GET", base+"/debug/live", nil); code != 404 {
		t.Errorf("GET /debug/live without Live = %d, want 404", code)
	}
	if code, _, _ := do(t, "GET", base+"/nope", nil); code != 404 {
		t.Errorf("GET /nope = %d, want 404", code)
	}
}
