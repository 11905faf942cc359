package envconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestFeatures: the switches ztunnel reads besides its socket and address
// settings, each at its default and set (SPEC §0.3).
func TestFeatures(t *testing.T) {
	type got struct {
		Proxy, Baggage, UserTimeout, AuthzInfo, TLS12 bool
		Compliance                                    string
	}
	read := func(c Config) got {
		return got{c.EnableProxy, c.ResponseBaggage, c.UserTimeoutEnabled, c.AuthzPolicyInfoLogging, c.TLS12Enabled, c.CompliancePolicy}
	}
	def := got{Proxy: true, Baggage: true}
	for _, tc := range []struct {
		env  []string
		want got
	}{
		{nil, def},
		{[]string{"ENABLE_PROXY=false"}, got{Baggage: true}}, // the DNS proxy still runs
		{[]string{"ENABLE_PROXY=true"}, def},
		{[]string{"ENABLE_RESPONSE_BAGGAGE=false"}, got{Proxy: true}},
		{[]string{"USER_TIMEOUT_ENABLED=true"}, got{Proxy: true, Baggage: true, UserTimeout: true}},
		{[]string{"AUTHZ_POLICY_INFO_LOGGING=true"}, got{Proxy: true, Baggage: true, AuthzInfo: true}},
		{[]string{"TLS12_ENABLED=true"}, got{Proxy: true, Baggage: true, TLS12: true}},
		{[]string{"COMPLIANCE_POLICY=pqc"}, got{Proxy: true, Baggage: true, Compliance: CompliancePQC}},
		{[]string{"COMPLIANCE_POLICY="}, def},
	} {
		c, err := Load(tc.env)
		if err != nil {
			t.Errorf("Load(%q): %v", tc.env, err)
			continue
		}
		if diff := cmp.Diff(tc.want, read(c)); diff != "" {
			t.Errorf("Load(%q) mismatch (-want +got):\n%s", tc.env, diff)
		}
	}
}

// TestComplianceFIPS: COMPLIANCE_POLICY=fips-140-2 is honoured only when
// Go's FIPS 140-3 mode is on, which a program cannot switch on itself;
// otherwise start-up stops saying how to turn it on.
func TestComplianceFIPS(t *testing.T) {
	defer func(f func() bool) { fips140Enabled = f }(fips140Enabled)
	env := []string{"COMPLIANCE_POLICY=fips-140-2"}
	fips140Enabled = func() bool { return false }
	if _, err := Load(env); err == nil || !strings.Contains(err.Error(), "COMPLIANCE_POLICY: ") || !strings.Contains(err.Error(), "GODEBUG=fips140=on") {
		t.Errorf("FIPS mode off: Load(%q) error = %v, want one naming COMPLIANCE_POLICY and GODEBUG=fips140=on", env, err)
	}
	fips140Enabled = func() bool { return true }
	if c, err := Load(env); err != nil || c.CompliancePolicy != ComplianceFIPS {
		t.Errorf("FIPS mode on: Load(%q) = %q, %v; want %q", env, c.CompliancePolicy, err, ComplianceFIPS)
	}
}

// TestUserTimeout: ztunnel's TCP_USER_TIMEOUT is KEEPALIVE_TIME +
// KEEPALIVE_RETRIES × KEEPALIVE_INTERVAL, also with keep-alive off, and
// nothing unless USER_TIMEOUT_ENABLED.
func TestUserTimeout(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want time.Duration
	}{
		{nil, 0},
		{[]string{"KEEPALIVE_TIME=10s"}, 0},
		{[]string{"USER_TIMEOUT_ENABLED=true"}, 180*time.Second + 9*180*time.Second},
		{[]string{"USER_TIMEOUT_ENABLED=true", "KEEPALIVE_TIME=10s", "KEEPALIVE_INTERVAL=2s", "KEEPALIVE_RETRIES=5"}, 20 * time.Second},
		{[]string{"USER_TIMEOUT_ENABLED=true", "KEEPALIVE_ENABLED=false", "KEEPALIVE_TIME=1s", "KEEPALIVE_INTERVAL=1s", "KEEPALIVE_RETRIES=1"}, 2 * time.Second},
	} {
		c, err := Load(tc.env)
		if err != nil || c.UserTimeout() != tc.want {
			t.Errorf("Load(%q).UserTimeout() = %v, %v; want %v", tc.env, c.UserTimeout(), err, tc.want)
		}
	}
}

// TestEmptyCAAddress: an empty CA_ADDRESS is refused (ztunnel panics at
// start-up with it and no FAKE_CA); it never falls back on the default CA
// or on insecure certificates.
func TestEmptyCAAddress(t *testing.T) {
	for _, env := range [][]string{
		{"CA_ADDRESS="},
		{"CA_ADDRESS=", "KUBERNETES_SERVICE_HOST=10.0.0.1"},
		{"CA_ADDRESS=", "XDS_ADDRESS="},
	} {
		c, err := Load(env)
		if err == nil || !strings.HasPrefix(err.Error(), ErrInvalid.Error()+": CA_ADDRESS: ") {
			t.Errorf("Load(%q) = CA %q, error %v; want an error naming CA_ADDRESS", env, c.CAAddress, err)
		}
	}
}

// TestProxyConfig: the mesh config's defaultConfig, then PROXY_CONFIG
// (YAML or JSON) field by field, then the variables, as ztunnel merges
// them; other ProxyConfig fields are ignored.
func TestProxyConfig(t *testing.T) {
	dir := t.TempDir()
	mesh := filepath.Join(dir, "mesh")
	if err := os.WriteFile(mesh, []byte(`
defaultConfig:
  discoveryAddress: istiod.mesh:15012
  proxyAdminPort: 16000
  concurrency: 3
  holdApplicationUntilProxyStarts: true
  proxyMetadata:
    ISTIO_META_DNS_CAPTURE: "false"
    FROM_MESH: a
    BOTH: mesh
trustDomain: ignored.local
`), 0o600); err != nil {
		t.Fatal(err)
	}
	type got struct {
		XDS, CA     string
		Admin       uint16
		Stats       uint16
		Concurrency uint16
		Meta        map[string]string
		DNSCapture  bool
		Workers     int
	}
	read := func(c Config) got {
		var n uint16
		if c.Workers.Concurrency != nil {
			n = *c.Workers.Concurrency
		}
		return got{c.XDSAddress, c.CAAddress, c.AdminPort, c.StatsPort, n, c.Meta, c.DNSCapture, c.Workers.Count(16)}
	}
	for _, tc := range []struct {
		name string
		mesh string
		env  []string
		want got
	}{
		{"no mesh config", filepath.Join(dir, "absent"), nil, got{
			XDS: "https://localhost:15012", CA: "https://localhost:15012", Admin: 15000, Stats: 15020,
			Meta: map[string]string{}, DNSCapture: true, Workers: 4}},
		{"mesh config", mesh, nil, got{
			XDS: "https://istiod.mesh:15012", CA: "https://localhost:15012", Admin: 16000, Stats: 15020, Concurrency: 3,
			Meta: map[string]string{"DNS_CAPTURE": "false", "FROM_MESH": "a", "BOTH": "mesh"}, Workers: 3}},
		{"PROXY_CONFIG over it", mesh, []string{
			`PROXY_CONFIG={"statsPort": 16020, "concurrency": 0, "discoveryAddress": "https://istiod.env:15012", "proxyMetadata": {"BOTH": "pc"}}`,
		}, got{
			XDS: "https://istiod.env:15012", CA: "https://localhost:15012", Admin: 16000, Stats: 16020,
			Meta: map[string]string{"DNS_CAPTURE": "false", "FROM_MESH": "a", "BOTH": "pc"}, Workers: 16}},
		{"variables over both", mesh, []string{
			"PROXY_CONFIG=proxyMetadata: {BOTH: pc}", "ISTIO_META_BOTH=env", "ISTIO_META_DNS_CAPTURE=true",
			"XDS_ADDRESS=istiod.var:15012", "ZTUNNEL_WORKER_THREADS=5",
		}, got{
			XDS: "https://istiod.var:15012", CA: "https://localhost:15012", Admin: 16000, Stats: 15020, Concurrency: 3,
			Meta: map[string]string{"DNS_CAPTURE": "true", "FROM_MESH": "a", "BOTH": "env"}, DNSCapture: true, Workers: 5}},
		{"empty discoveryAddress disables xDS", filepath.Join(dir, "absent"), []string{`PROXY_CONFIG=discoveryAddress: ""`}, got{
			CA: "https://localhost:15012", Admin: 15000, Stats: 15020, Meta: map[string]string{}, DNSCapture: true, Workers: 4}},
		{"empty PROXY_CONFIG", filepath.Join(dir, "absent"), []string{"PROXY_CONFIG="}, got{
			XDS: "https://localhost:15012", CA: "https://localhost:15012", Admin: 15000, Stats: 15020,
			Meta: map[string]string{}, DNSCapture: true, Workers: 4}},
	} {
		c, err := load(tc.env, tc.mesh)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if diff := cmp.Diff(tc.want, read(c)); diff != "" {
			t.Errorf("%s: mismatch (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestBadMeshConfig: a mesh config file that does not parse, or cannot be
// read, stops start-up in one line naming it.
func TestBadMeshConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "mesh")
	if err := os.WriteFile(bad, []byte("defaultConfig:\n  concurrency: lots\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, dir} { // a directory cannot be read as a file
		_, err := load(nil, path)
		if err == nil || !strings.Contains(err.Error(), "mesh config "+path+": ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("load(mesh config %s) error = %v, want one line naming the file", path, err)
		}
	}
}
