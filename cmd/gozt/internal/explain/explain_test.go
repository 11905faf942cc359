package explain_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/cmd/gozt/internal/explain"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

const (
	frontendID = "spiffe://cluster.local/ns/web/sa/frontend"
	legacyID   = "spiffe://cluster.local/ns/legacy/sa/old"
)

// outcome is the part of a decision the tables pin down.
type outcome struct {
	Allow   bool
	Reason  string
	Policy  string
	Rule    int // -1: no deciding rule
	Summary string
}

func outcomeOf(d explain.Decision) outcome {
	o := outcome{Allow: d.Allow, Reason: d.Reason, Policy: d.Policy, Rule: -1, Summary: d.Summary}
	if d.Rule != nil {
		o.Rule = *d.Rule
	}
	return o
}

// fixtureCase is a query against fixtureStore with its expected outcome.
type fixtureCase struct {
	name  string
	query string
	want  outcome
}

var fixtureCases = []fixtureCase{
	{
		name:  "allowed by ALLOW",
		query: "src=10.1.0.5&identity=" + frontendID + "&dst=10.0.0.10:8080",
		want: outcome{Allow: true, Reason: "AllowedByPolicy", Policy: "prod/allow-frontend", Rule: 0,
			Summary: "allowed by policy prod/allow-frontend rule 0 (principals,destination_ports)"},
	},
	{
		name:  "denied by DENY rule 1",
		query: "src=192.168.7.7:5555&identity=" + frontendID + "&dst=10.0.0.10:8080",
		want: outcome{Reason: "DeniedByPolicy", Policy: "prod/deny-legacy", Rule: 1,
			Summary: "denied by policy prod/deny-legacy rule 1 (source_ips)"},
	},
	{
		name:  "denied by DENY rule 0",
		query: "src=10.1.0.5&identity=" + legacyID + "&dst=10.0.0.10:8080",
		want: outcome{Reason: "DeniedByPolicy", Policy: "prod/deny-legacy", Rule: 0,
			Summary: "denied by policy prod/deny-legacy rule 0 (principals)"},
	},
	{
		name:  "no ALLOW matched (wrong port)",
		query: "src=10.1.0.5&identity=" + frontendID + "&dst=10.0.0.10:9090",
		want:  outcome{Reason: "DeniedNoAllowMatched", Rule: -1, Summary: "no ALLOW policy matched"},
	},
	{
		name:  "no ALLOW matched (plaintext)",
		query: "src=10.1.0.5&dst=10.0.0.10:8080",
		want:  outcome{Reason: "DeniedNoAllowMatched", Rule: -1, Summary: "no ALLOW policy matched"},
	},
	{
		name:  "unknown referenced policy",
		query: "src=10.1.0.5&identity=" + frontendID + "&dst=10.0.0.20:5432",
		want: outcome{Reason: "DeniedUnknownPolicy", Rule: -1,
			Summary: "referenced policy prod/db-lockdown unknown"},
	},
	{
		name:  "no policy applies",
		query: "src=10.1.0.5:1234&dst=10.0.0.30:80",
		want:  outcome{Allow: true, Reason: "AllowedNoPolicies", Rule: -1, Summary: "allowed: no ALLOW policy applies"},
	},
}

// get serves one request through Handler against st.
func get(t testing.TB, st *state.Store, method, rawQuery string) *httptest.ResponseRecorder {
	t.Helper()
	h := explain.Handler(st.Snapshot)
	req := httptest.NewRequest(method, "/debug/authz?"+rawQuery, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHandlerDecisions(t *testing.T) {
	st := fixtureStore(t)
	for _, tc := range fixtureCases {
		t.Run(tc.name, func(t *testing.T) {
			rec := get(t, st, http.MethodGet, tc.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d, body %s", rec.Code, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var res explain.Result
			if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
				t.Fatalf("decode: %v\n%s", err, rec.Body)
			}
			if diff := cmp.Diff(tc.want, outcomeOf(res.Decision)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			// The explanation agrees with the evaluator the proxy enforces.
			v, _ := url.ParseQuery(tc.query)
			q, err := explain.ParseQuery(v)
			if err != nil {
				t.Fatal(err)
			}
			snap := st.Snapshot()
			w := snap.WorkloadByIP("", q.Dst.Addr())
			d := rbac.Evaluate(snap, rbac.Target{Namespace: w.Namespace, PolicyRefs: w.AuthorizationPolicies},
				rbac.Conn{Src: q.Src, Dst: q.Dst, Identity: q.Identity})
			if d.Allow != res.Decision.Allow || d.String() != res.Decision.Summary {
				t.Errorf("rbac.Evaluate says %v %q, explain says %v %q", d.Allow, d, res.Decision.Allow, res.Decision.Summary)
			}
		})
	}
}

func TestHandlerExplainsEveryPolicy(t *testing.T) {
	st := fixtureStore(t)
	rec := get(t, st, http.MethodGet, "src=192.168.7.7&identity="+frontendID+"&dst=10.0.0.10:8080")
	var res explain.Result
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
		t.Fatalf("decode: %v", err)
	}
	wantWorkload := explain.Workload{
		UID: "Kubernetes//Pod/prod/server", Name: "server", Namespace: "prod",
		Identity:              "spiffe://cluster.local/ns/prod/sa/server",
		AuthorizationPolicies: []string{"prod/allow-frontend"},
	}
	if diff := cmp.Diff(wantWorkload, res.Workload); diff != "" {
		t.Errorf("workload (-want +got):\n%s", diff)
	}
	type rr struct {
		Matched bool
		Clauses []bool
	}
	type pr struct {
		Key, AppliesBy           string
		DryRun, Matched, Decided bool
		Rules                    []rr
	}
	var got []pr
	for _, p := range res.Policies {
		x := pr{Key: p.Key, AppliesBy: p.AppliesBy, DryRun: p.DryRun, Matched: p.Matched, Decided: p.Decided}
		for _, r := range p.Rules {
			x.Rules = append(x.Rules, rr{r.Matched, r.Clauses})
		}
		got = append(got, x)
	}
	// Evaluation order: dry-run DENY, DENY, (dry-run ALLOW), ALLOW.
	want := []pr{
		{Key: "istio-system/audit-all", AppliesBy: "global", DryRun: true, Matched: true,
			Rules: []rr{{true, []bool{true}}}},
		{Key: "prod/deny-legacy", AppliesBy: "namespace", Matched: true, Decided: true,
			Rules: []rr{{false, []bool{false}}, {true, []bool{true}}}},
		{Key: "prod/allow-frontend", AppliesBy: "reference", Matched: true,
			Rules: []rr{{true, []bool{true, true}}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	if res.Src != "192.168.7.7:0" || res.Dst != "10.0.0.10:8080" || res.Identity != frontendID {
		t.Errorf("echoed query = %q %q %q", res.Src, res.Dst, res.Identity)
	}
}

func TestHandlerUnknownRefsListed(t *testing.T) {
	st := fixtureStore(t)
	rec := get(t, st, http.MethodGet, "src=10.1.0.5&dst=10.0.0.20:5432")
	var res explain.Result
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if diff := cmp.Diff([]string{"prod/db-lockdown"}, res.UnknownRefs); diff != "" {
		t.Errorf("unknown_refs (-want +got):\n%s", diff)
	}
	if res.Decision.Missing != "prod/db-lockdown" {
		t.Errorf("missing = %q", res.Decision.Missing)
	}
}

func TestHandlerErrors(t *testing.T) {
	st := fixtureStore(t)
	for _, tc := range []struct {
		name, method, query string
		code                int
		wantInError         []string
	}{
		{"missing dst", "GET", "src=10.1.0.5", 400, []string{"dst", "required"}},
		{"missing src", "GET", "dst=10.0.0.10:8080", 400, []string{"src", "required"}},
		{"dst without port", "GET", "src=10.1.0.5&dst=10.0.0.10", 400, []string{"dst", "no port"}},
		{"dst port 0", "GET", "src=10.1.0.5&dst=10.0.0.10:0", 400, []string{"dst", "port"}},
		{"dst garbage", "GET", "src=10.1.0.5&dst=server:80", 400, []string{"dst", "server:80"}},
		{"src garbage", "GET", "src=nope&dst=10.0.0.10:8080", 400, []string{"src", "nope"}},
		{"bad identity", "GET", "src=10.1.0.5&dst=10.0.0.10:8080&identity=cluster.local/ns/a/sa/b", 400,
			[]string{"identity", "spiffe://"}},
		{"misspelt parameter", "GET", "src=10.1.0.5&dst=10.0.0.10:8080&identiy=" + frontendID, 400,
			[]string{"identiy", "unknown parameter"}},
		{"repeated parameter", "GET", "src=10.1.0.5&dst=10.0.0.10:8080&dst=10.0.0.20:80", 400,
			[]string{"dst", "2 times"}},
		{"no workload", "GET", "src=10.1.0.5&dst=10.9.9.9:80", 404, []string{"10.9.9.9"}},
		{"service VIP", "GET", "src=10.1.0.5&dst=10.96.0.10:80", 404,
			[]string{"VIP of service prod/server.prod.svc.cluster.local"}},
		{"other network", "GET", "src=10.1.0.5&dst=10.0.0.10:8080&network=east", 404,
			[]string{`on network "east"`, `Kubernetes//Pod/prod/server is on network ""`}},
		{"POST", "POST", "src=10.1.0.5&dst=10.0.0.10:8080", 405, []string{"method"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := get(t, st, tc.method, tc.query)
			if rec.Code != tc.code {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tc.code, rec.Body)
			}
			var body struct{ Error string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("error body is not JSON: %v: %s", err, rec.Body)
			}
			for _, s := range tc.wantInError {
				if !strings.Contains(body.Error, s) {
					t.Errorf("error %q does not mention %q", body.Error, s)
				}
			}
		})
	}
}

func TestHandlerNoSnapshot(t *testing.T) {
	h := explain.Handler(func() *state.Snapshot { return nil })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/authz?src=10.0.0.1&dst=10.0.0.2:80", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("status = %d, want 503", rec.Code)
	}
}

// The handler reads the snapshot per request: a policy change shows at once.
func TestHandlerFollowsLiveState(t *testing.T) {
	st := fixtureStore(t)
	q := "src=10.1.0.5&identity=" + frontendID + "&dst=10.0.0.10:8080"
	decision := func() explain.Decision {
		var res explain.Result
		if err := json.Unmarshal(get(t, st, "GET", q).Body.Bytes(), &res); err != nil {
			t.Fatal(err)
		}
		return res.Decision
	}
	if d := decision(); !d.Allow {
		t.Fatalf("before: %s", d.Summary)
	}
	var err error
	st.Update(func(b *state.Batch) {
		err = b.InsertPolicy(policy("prod", "deny-frontend", rbac.Namespace, rbac.Deny,
			rule(clause(rbac.Match{Principals: []rbac.StringMatch{exact("cluster.local/ns/web/sa/frontend")}}))))
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := decision(); d.Allow || d.Policy != "prod/deny-frontend" {
		t.Errorf("after DENY: %+v", d)
	}
}

func TestParseQuery(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want explain.Query
	}{
		{"src=10.0.0.1&dst=10.0.0.2:80", explain.Query{
			Src: netip.MustParseAddrPort("10.0.0.1:0"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}},
		{"src=10.0.0.1:4000&dst=10.0.0.2:80&network=east", explain.Query{
			Src: netip.MustParseAddrPort("10.0.0.1:4000"), Dst: netip.MustParseAddrPort("10.0.0.2:80"), Network: "east"}},
		{"src=fd00::1&dst=[fd00::2]:443", explain.Query{
			Src: netip.MustParseAddrPort("[fd00::1]:0"), Dst: netip.MustParseAddrPort("[fd00::2]:443")}},
		{"src=[fd00::1]&dst=[fd00::2]:443", explain.Query{
			Src: netip.MustParseAddrPort("[fd00::1]:0"), Dst: netip.MustParseAddrPort("[fd00::2]:443")}},
		{"src=[fd00::1]:9&dst=[fd00::2]:443&identity=" + url.QueryEscape(frontendID), explain.Query{
			Src: netip.MustParseAddrPort("[fd00::1]:9"), Dst: netip.MustParseAddrPort("[fd00::2]:443"),
			Identity: identity.MustParse(frontendID)}},
	} {
		v, err := url.ParseQuery(tc.raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := explain.ParseQuery(v)
		if err != nil {
			t.Errorf("ParseQuery(%s): %v", tc.raw, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
			t.Errorf("ParseQuery(%s) (-want +got):\n%s", tc.raw, diff)
		}
		back, err := explain.ParseQuery(got.Values())
		if err != nil || back != got {
			t.Errorf("round trip of %s: %+v, %v", tc.raw, back, err)
		}
	}
}

func TestParseQueryErrorNamesParameter(t *testing.T) {
	for raw, param := range map[string]string{
		"dst=10.0.0.2:80":                          "src",
		"src=10.0.0.1":                             "dst",
		"src=10.0.0.1&dst=[fe80::1%25eth0]:80":     "dst",
		"src=fe80::1%25eth0&dst=10.0.0.2:80":       "src",
		"src=10.0.0.1&dst=10.0.0.2:80&identity=x":  "identity",
		"src=10.0.0.1&dst=10.0.0.2:80&verbose=1":   "verbose",
		"src=10.0.0.1&src=10.0.0.3&dst=10.0.0.2:1": "src",
		"src=10.0.0.1&dst=10.0.0.2:65536":          "dst",
	} {
		v, _ := url.ParseQuery(raw)
		_, err := explain.ParseQuery(v)
		qe, ok := err.(*explain.QueryError)
		if !ok {
			t.Errorf("ParseQuery(%s) = %v, want a *QueryError", raw, err)
			continue
		}
		if qe.Param != param || !strings.HasPrefix(err.Error(), param+": ") {
			t.Errorf("ParseQuery(%s) error %q names %q, want %q", raw, err, qe.Param, param)
		}
	}
}

// FuzzParseQuery checks that any accepted query survives Values and back.
func FuzzParseQuery(f *testing.F) {
	f.Add("src=10.0.0.1&dst=10.0.0.2:80")
	f.Add("src=[fd00::1]:9&dst=[fd00::2]:443&identity=spiffe://cluster.local/ns/a/sa/b&network=n")
	f.Add("src=::ffff:10.0.0.1&dst=[::ffff:10.0.0.2]:80")
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := explain.ParseQuery(v)
		if err != nil {
			return
		}
		back, err := explain.ParseQuery(q.Values())
		if err != nil {
			t.Fatalf("re-parse of %v: %v", q.Values(), err)
		}
		if back != q {
			t.Fatalf("round trip: %+v != %+v", back, q)
		}
	})
}
