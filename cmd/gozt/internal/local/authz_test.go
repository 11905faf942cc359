//lint:file-ignore SA1019 x/net's http2.Transport is deliberately used as an independent HBONE peer (issue 2), deprecated or not.

package local

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// denyClient8080 denies the client's identity on port 8080 in namespace demo.
func denyClient8080() *rbac.Policy {
	return &rbac.Policy{
		Name: "deny-client-8080", Namespace: "demo", Scope: rbac.Namespace, Action: rbac.Deny,
		Rules: []rbac.Rule{{Clauses: []rbac.Clause{
			{Matches: []rbac.Match{{Principals: []rbac.StringMatch{{Kind: rbac.Exact, Value: "cluster.local/ns/demo/sa/client"}}}}},
			{Matches: []rbac.Match{{DestinationPorts: []uint16{8080}}}},
		}}},
	}
}

func setPolicy(t *testing.T, st *state.Store, p *rbac.Policy, remove bool) {
	t.Helper()
	var err error
	st.Update(func(b *state.Batch) {
		if remove {
			b.RemovePolicy(p.Key())
			return
		}
		err = b.InsertPolicy(p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAuthorizationEndToEnd: a DENY for client → server:8080 makes the
// connection through SOCKS5 fail, the access log names the policy,
// /debug/authz explains it, and removing the policy lets the next
// connection through.
func TestAuthorizationEndToEnd(t *testing.T) {
	tm := startMesh(t)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	setPolicy(t, tm.Store(), denyClient8080(), false)

	tm.wantSocksDenied(t, tm.ips.Server+":8080")
	waitLog(t, tm, "demo/deny-client-8080")

	q := url.Values{
		"src":      {tm.ips.Client + ":1234"},
		"identity": {clientID.String()},
		"dst":      {tm.ips.Server + ":8080"},
	}
	body := httpGet(t, "http://"+tm.AdminAddr().String()+"/debug/authz?"+q.Encode())
	var res map[string]any
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatalf("/debug/authz is not JSON: %v\n%s", err, body)
	}
	if !strings.Contains(body, "deny-client-8080") || !strings.Contains(strings.ToLower(body), "denied") {
		t.Errorf("/debug/authz does not explain the deny:\n%s", body)
	}

	setPolicy(t, tm.Store(), denyClient8080(), true)
	c := tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	c.Close()
}

// TestPolicyChangeClosesLiveConnection: a DENY pushed while connections are
// open closes the denied one within a second; the other keeps flowing.
func TestPolicyChangeClosesLiveConnection(t *testing.T) {
	tm := startMesh(t)
	victim, other := victimAndOther(t, tm)

	setPolicy(t, tm.Store(), denyClient8080(), false)
	victim.SetReadDeadline(time.Now().Add(time.Second + 500*time.Millisecond))
	start := time.Now()
	if _, err := victim.Read(make([]byte, 1)); err == nil {
		t.Fatal("denied live connection still delivers data")
	} else if elapsed := time.Since(start); elapsed > time.Second+200*time.Millisecond {
		t.Errorf("denied live connection closed after %v (%v), want ≤ 1s", elapsed, err)
	}
	for range 10 {
		roundTrip(t, other)
	}
	waitLog(t, tm, "policy change")
}

// denyClient8080Config is a local config file whose one policy,
// demo/deny-client-8080, denies the client's identity on port 8080 of
// namespace demo: rulesBefore (YAML rule lines) and then that rule.
func denyClient8080Config(rulesBefore ...string) string {
	return `
policies:
- name: deny-client-8080
  namespace: demo
  scope: Namespace
  action: Deny
  rules:
` + strings.Join(rulesBefore, "") + `  - - - principals: [{Exact: cluster.local/ns/demo/sa/client}]
    - - destinationPorts: [8080]
`
}

// TestPolicyFromConfigFile: a DENY in the local config file denies
// client → server:8080 (401 on the tunnel, the client's connection closes,
// response flag DENY, the access log names the policy) while port 9090 stays
// open; removing the policy lets the next connection through.
func TestPolicyFromConfigFile(t *testing.T) {
	tm := startMeshWith(t, denyClient8080Config())
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	listenBackend(t, tm.ips.Server+":9090", echoHandler)

	tm.wantSocksDenied(t, tm.ips.Server+":8080")
	if got := b.accepted(); len(got) != 0 {
		t.Errorf("denied connection reached the backend %d times", len(got))
	}
	waitLog(t, tm, "denied by policy demo/deny-client-8080")
	metrics := httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics")
	if metricValue(metrics, "istio_tcp_connections_closed_total", `reporter="destination"`, `response_flags="DENY"`) < 1 {
		t.Errorf("no destination close with response_flags DENY in:\n%s", metrics)
	}

	c := tm.socksDial(t, tm.ips.Server+":9090")
	roundTrip(t, c)
	c.Close()

	setPolicy(t, tm.Store(), denyClient8080(), true)
	c = tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	c.Close()
}

// TestEarlyDataToDeniedTarget (TESTPLAN S27, bad input 23): DATA sent right
// after the CONNECT headers to a denied target is answered 401 and never
// reaches the destination, which sees no connection at all.
func TestEarlyDataToDeniedTarget(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	setPolicy(t, tm.Store(), denyClient8080(), false)

	tr := &http2.Transport{TLSClientConfig: tm.clientTLS(t)}
	defer tr.CloseIdleConnections()
	body := strings.NewReader(strings.Repeat("smuggled bytes ", 1000))
	req, err := http.NewRequest(http.MethodConnect, "https://"+tm.ips.Server+":15008", io.NopCloser(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = tm.ips.Server + ":8080"
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("CONNECT to a denied target = %d, want 401", resp.StatusCode)
	}
	if got := b.accepted(); len(got) != 0 {
		t.Errorf("denied target was dialed %d times", len(got))
	}
}

// victimAndOther opens, through the client's SOCKS5 port, one connection to
// an echo on server:8080 (which denyClient8080 denies) and one to an echo on
// server:9090, each after a round trip; the test's end closes both.
func victimAndOther(t *testing.T, tm *testMesh) (victim, other net.Conn) {
	t.Helper()
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	listenBackend(t, tm.ips.Server+":9090", echoHandler)
	victim = tm.socksDial(t, tm.ips.Server+":8080")
	t.Cleanup(func() { victim.Close() })
	other = tm.socksDial(t, tm.ips.Server+":9090")
	t.Cleanup(func() { other.Close() })
	roundTrip(t, victim)
	roundTrip(t, other)
	return victim, other
}
