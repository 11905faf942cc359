package explain_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/cmd/gozt/internal/configdump"
	"github.com/gozt/gozt/cmd/gozt/internal/explain"
	"github.com/gozt/gozt/state"
)

var update = flag.Bool("update", false, "rewrite testdata/gozt-dump.json from fixtureStore")

const (
	goztDump    = "testdata/gozt-dump.json"
	ztunnelDump = "testdata/ztunnel-dump.json"
)

// argsFor turns a query string into Run's flags.
func argsFor(t testing.TB, dump, rawQuery string, extra ...string) []string {
	t.Helper()
	v, err := url.ParseQuery(rawQuery)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--config-dump", dump}
	for name, vals := range v {
		for _, val := range vals {
			args = append(args, "--"+name, val)
		}
	}
	return append(args, extra...)
}

func run(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = explain.Run(args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// liveJSON is what /debug/authz would answer for rawQuery against st.
func liveJSON(t testing.TB, st *state.Store, rawQuery string) string {
	t.Helper()
	v, _ := url.ParseQuery(rawQuery)
	q, err := explain.ParseQuery(v)
	if err != nil {
		t.Fatal(err)
	}
	res, err := explain.Explain(st.Snapshot(), q)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// TestGoztDumpTestdata keeps testdata/gozt-dump.json equal to the config_dump
// of fixtureStore (run with -update after an intended change).
func TestGoztDumpTestdata(t *testing.T) {
	got, err := json.MarshalIndent(configdump.FromSnapshot(fixtureStore(t).Snapshot()), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile(goztDump, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goztDump)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s is stale (go test -run TestGoztDumpTestdata -update) (-file +now):\n%s", goztDump, diff)
	}
}

func TestRunGoztDumpMatchesLive(t *testing.T) {
	live := fixtureStore(t)
	for _, tc := range fixtureCases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(t, argsFor(t, goztDump, tc.query)...)
			if err != nil {
				t.Fatalf("Run: %v\nstderr: %s", err, stderr)
			}
			if stderr != "" {
				t.Errorf("unexpected stderr: %s", stderr)
			}
			if diff := cmp.Diff(liveJSON(t, live, tc.query), stdout); diff != "" {
				t.Errorf("offline answer differs from live (-live +offline):\n%s", diff)
			}
			var res explain.Result
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomeOf(res.Decision)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

// Queries against testdata/ztunnel-dump.json, a dump in real ztunnel's shape.
var ztunnelCases = []fixtureCase{
	{
		name:  "web prefix principal and port",
		query: "src=10.244.2.5:40000&identity=spiffe://cluster.local/ns/web/sa/frontend&dst=10.244.1.10:8443",
		want: outcome{Allow: true, Reason: "AllowedByPolicy", Policy: "prod/allow-web", Rule: 0,
			Summary: "allowed by policy prod/allow-web rule 0 (principals,destination_ports)"},
	},
	{
		name:  "web on a port not allowed",
		query: "src=10.244.2.5&identity=spiffe://cluster.local/ns/web/sa/frontend&dst=10.244.1.10:9090",
		want:  outcome{Reason: "DeniedNoAllowMatched", Rule: -1, Summary: "no ALLOW policy matched"},
	},
	{
		name:  "service account rule",
		query: "src=10.244.1.20&identity=spiffe://other.domain/ns/prod/sa/db&dst=10.244.1.10:5432",
		want: outcome{Allow: true, Reason: "AllowedByPolicy", Policy: "prod/allow-web", Rule: 1,
			Summary: "allowed by policy prod/allow-web rule 1 (service_accounts)"},
	},
	{
		name:  "plaintext hits not_namespaces DENY",
		query: "src=10.244.2.5&dst=10.244.1.10:8080",
		want: outcome{Reason: "DeniedByPolicy", Policy: "prod/deny-blocked", Rule: 0,
			Summary: "denied by policy prod/deny-blocked rule 0 (not_namespaces)"},
	},
	{
		name:  "blocked source range",
		query: "src=192.168.3.4&identity=spiffe://cluster.local/ns/web/sa/frontend&dst=10.244.1.10:8080",
		want: outcome{Reason: "DeniedByPolicy", Policy: "prod/deny-blocked", Rule: 0,
			Summary: "denied by policy prod/deny-blocked rule 0 (source_ips)"},
	},
	{
		name:  "referenced policy missing from the dump",
		query: "src=10.244.1.10&identity=spiffe://cluster.local/ns/prod/sa/server&dst=10.244.1.20:5432",
		want: outcome{Reason: "DeniedUnknownPolicy", Rule: -1,
			Summary: "referenced policy prod/missing-policy unknown"},
	},
	{
		name:  "L7-only DENY is enforced (fail closed)",
		query: "src=10.244.2.5&identity=spiffe://cluster.local/ns/web/sa/frontend&dst=10.244.3.3:80",
		want: outcome{Reason: "DeniedByPolicy", Policy: "legacy/l7-only-deny", Rule: 0,
			Summary: "denied by policy legacy/l7-only-deny rule 0 (empty_match)"},
	},
	{
		name:  "IPv6 CIDR allow",
		query: "src=[fd00:10:244::9]:1234&identity=spiffe://cluster.local/ns/v6/sa/client&dst=[fd00:10:244::7]:80",
		want: outcome{Allow: true, Reason: "AllowedByPolicy", Policy: "v6/allow-v6-cidr", Rule: 0,
			Summary: "allowed by policy v6/allow-v6-cidr rule 0 (not_principals,source_ips,destination_ips)"},
	},
	{
		name:  "IPv6 banned suffix",
		query: "src=fd00:10:244::9&identity=spiffe://cluster.local/ns/v6/sa/banned&dst=[fd00:10:244::7]:80",
		want:  outcome{Reason: "DeniedNoAllowMatched", Rule: -1, Summary: "no ALLOW policy matched"},
	},
	{
		name:  "IPv6 outside the range",
		query: "src=fd00:99::1&dst=[fd00:10:244::7]:80",
		want:  outcome{Reason: "DeniedNoAllowMatched", Rule: -1, Summary: "no ALLOW policy matched"},
	},
}

func TestRunZtunnelDumpMatchesLive(t *testing.T) {
	live := ztunnelEquivalentStore(t)
	for _, tc := range ztunnelCases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(t, argsFor(t, ztunnelDump, tc.query)...)
			if err != nil {
				t.Fatalf("Run: %v\nstderr: %s", err, stderr)
			}
			if stderr != "" {
				t.Errorf("unexpected stderr: %s", stderr)
			}
			var res explain.Result
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomeOf(res.Decision)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(liveJSON(t, live, tc.query), stdout); diff != "" {
				t.Errorf("offline answer differs from live (-live +offline):\n%s", diff)
			}
		})
	}
}

func TestRunZtunnelDumpDryRunShown(t *testing.T) {
	stdout, _, err := run(t, argsFor(t, ztunnelDump,
		"src=10.244.2.5&identity=spiffe://cluster.local/ns/web/sa/frontend&dst=10.244.1.10:8080")...)
	if err != nil {
		t.Fatal(err)
	}
	var res explain.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Policies) == 0 || res.Policies[0].Key != "istio-system/mesh-dryrun" ||
		!res.Policies[0].DryRun || res.Policies[0].Note != "dry run: would deny" {
		t.Errorf("first policy = %+v, want the matching dry-run DENY", res.Policies[0])
	}
	if !res.Decision.Allow {
		t.Errorf("a dry-run DENY decided: %+v", res.Decision)
	}
}

// A policy the dump holds that gozt rejects is skipped with a warning, and a
// workload that references it is denied, as it would be live.
func TestRunSkipsRejectedPolicyAndFailsClosed(t *testing.T) {
	dump := `{
	  "workloads": [{"workloadIps": ["10.1.1.1"], "uid": "u1", "name": "a", "namespace": "ns",
	                 "protocol": "HBONE", "authorizationPolicies": ["ns/odd"], "surprise": {"x": 1}}],
	  "policies": [{"name": "odd", "namespace": "ns", "scope": "Cluster", "action": "Allow", "rules": [], "dryRun": false}],
	  "somethingNew": [1, 2, 3]
	}`
	path := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(path, []byte(dump), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := run(t, "--config-dump", path, "--src", "10.2.2.2", "--dst", "10.1.1.1:80")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(stderr, "warning: skipped policy 0 (ns/odd)") || !strings.Contains(stderr, `"Cluster"`) {
		t.Errorf("stderr = %q, want a warning naming the skipped policy and its bad scope", stderr)
	}
	var res explain.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatal(err)
	}
	if res.Decision.Allow || res.Decision.Reason != "DeniedUnknownPolicy" || res.Decision.Missing != "ns/odd" {
		t.Errorf("decision = %+v, want DeniedUnknownPolicy ns/odd", res.Decision)
	}
}

func TestRunText(t *testing.T) {
	stdout, _, err := run(t, argsFor(t, goztDump,
		"src=192.168.7.7&identity="+frontendID+"&dst=10.0.0.10:8080", "--format", "text")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"DENY 192.168.7.7:0 (" + frontendID + ") -> 10.0.0.10:8080\n",
		"workload: Kubernetes//Pod/prod/server (prod/server, spiffe://cluster.local/ns/prod/sa/server)\n",
		"decision: denied by policy prod/deny-legacy rule 1 (source_ips)\n",
		"  DENY  prod/deny-legacy [namespace]: matched <- decided\n",
		"    rule 0: no match, clauses [false]\n",
		"    rule 1: matched (source_ips), clauses [true]\n",
		"  DENY  istio-system/audit-all [global, dry run]: matched (dry run: would deny)\n",
		"  ALLOW prod/allow-frontend [reference]: matched\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, stdout)
		}
	}
	stdout, _, err = run(t, argsFor(t, goztDump, "src=10.1.0.5&dst=10.0.0.20:80", "--format", "text")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "unknown referenced policies (deny): prod/db-lockdown\n") {
		t.Errorf("text output lacks the unknown reference:\n%s", stdout)
	}
}

func TestRunErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(empty, []byte(`{"workloads": [], "config": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	notJSON := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(notJSON, []byte("workloads: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no dump", []string{"--src", "10.0.0.1", "--dst", "10.0.0.10:8080"}, []string{"--config-dump", "required"}},
		{"no dst", []string{"--config-dump", goztDump, "--src", "10.0.0.1"}, []string{"--dst", "required"}},
		{"no src", []string{"--config-dump", goztDump, "--dst", "10.0.0.10:8080"}, []string{"--src", "required"}},
		{"bad identity", []string{"--config-dump", goztDump, "--src", "10.0.0.1", "--dst", "10.0.0.10:8080",
			"--identity", "web/frontend"}, []string{"--identity"}},
		{"bad format", []string{"--config-dump", goztDump, "--src", "10.0.0.1", "--dst", "10.0.0.10:8080",
			"--format", "yaml"}, []string{"--format", "yaml"}},
		{"stray argument", []string{"--config-dump", goztDump, "extra"}, []string{"unexpected argument", "extra"}},
		{"missing file", []string{"--config-dump", "testdata/nope.json", "--src", "10.0.0.1", "--dst", "10.0.0.10:8080"},
			[]string{"nope.json"}},
		{"empty dump", []string{"--config-dump", empty, "--src", "10.0.0.1", "--dst", "10.0.0.10:8080"},
			[]string{"no workloads"}},
		{"not JSON", []string{"--config-dump", notJSON, "--src", "10.0.0.1", "--dst", "10.0.0.10:8080"},
			[]string{"bad.json", "parse config dump"}},
		{"unknown dst", []string{"--config-dump", ztunnelDump, "--src", "10.0.0.1", "--dst", "10.96.0.10:80"},
			[]string{"VIP of service prod/server.prod.svc.cluster.local"}},
		{"unknown flag", []string{"--config-dump", goztDump, "--sorce", "10.0.0.1"}, []string{"sorce"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := run(t, tc.args...)
			if err == nil {
				t.Fatalf("Run succeeded:\n%s", stdout)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if stdout != "" {
				t.Errorf("stdout on error: %q", stdout)
			}
		})
	}
}
