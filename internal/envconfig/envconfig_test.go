package envconfig

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDefaults(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ got, want any }{
		"mode":               {c.ProxyMode, ModeShared},
		"xds":                {c.XDSAddress, "https://localhost:15012"},
		"ca":                 {c.CAAddress, "https://localhost:15012"},
		"cluster":            {c.ClusterID, "Kubernetes"},
		"ttl":                {c.SecretTTL, 24 * time.Hour},
		"drain":              {c.DrainDeadline, 5 * time.Second},
		"mark":               {c.PacketMark, uint32(1337)},
		"window":             {c.StreamWindow, uint32(4 << 20)},
		"conn window":        {c.ConnWindow, uint32(16 << 20)},
		"frame":              {c.FrameSize, uint32(1 << 20)},
		"streams":            {c.PoolMaxStreams, 100},
		"idle":               {c.PoolIdleTimeout, 5 * time.Minute},
		"instance":           {c.InstanceIP, "1.1.1.1"},
		"version":            {c.IstioVersion, "unknown"},
		"td":                 {c.TrustDomain, "cluster.local"},
		"keepalive":          {c.KeepaliveEnabled, true},
		"ka time":            {c.KeepaliveTime, 180 * time.Second},
		"ka interval":        {c.KeepaliveInterval, 180 * time.Second},
		"ka retries":         {c.KeepaliveRetries, 9},
		"inpod uds":          {c.InpodUDS, "/var/run/ztunnel/ztunnel.sock"},
		"port reuse":         {c.InpodPortReuse, true},
		"dns capture":        {c.DNSCapture, true},
		"dns addr":           {c.DNSProxyAddr, "localhost:15053"},
		"dns listen":         {fmt.Sprint(c.DNSListenAddrs()), "[127.0.0.1:15053 [::1]:15053]"},
		"proxy":              {c.EnableProxy, true},
		"baggage":            {c.ResponseBaggage, true},
		"user timeout":       {c.UserTimeoutEnabled, false},
		"user timeout value": {c.UserTimeout(), time.Duration(0)},
		"authz info":         {c.AuthzPolicyInfoLogging, false},
		"tls12":              {c.TLS12Enabled, false},
		"compliance":         {c.CompliancePolicy, ""},
		"admin port":         {c.AdminPort, uint16(15000)},
		"stats port":         {c.StatsPort, uint16(15020)},
		"concurrency":        {c.Workers.Concurrency == nil, true},
		"ipv6":               {c.IPv6Enabled, true},
		"series grace":       {c.MetricsSeriesGrace, 5 * time.Minute},
		"max series":         {c.MetricsMaxSeries, 20000},
		"root grace":         {c.RootRotationGrace, 24 * time.Hour},
	} {
		if tc.got != tc.want {
			t.Errorf("default %s = %v, want %v", name, tc.got, tc.want)
		}
	}
}

func TestValues(t *testing.T) {
	c, err := Load([]string{
		"KUBERNETES_SERVICE_HOST=10.0.0.1",
		"PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=ns/name/sa",
		"CA_ADDRESS=istiod.example:15012",
		"ISTIO_META_CLUSTER_ID=c2", "CLUSTER_ID=ignored",
		"ISTIO_META_ISTIO_VERSION=1.30.0", "ISTIO_METAJSON_LABELS={\"a\":\"b\"}",
		"XDS_HEADER_X_TEST=1", "CA_HEADER_Y=2",
		"TERMINATION_GRACE_PERIOD_SECONDS=30",
		"ENABLE_ORIG_SRC=false",
		"KEEPALIVE_ENABLED=false", "KEEPALIVE_TIME=30s", "KEEPALIVE_INTERVAL=1m", "KEEPALIVE_RETRIES=3",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.XDSAddress != "https://istiod.istio-system.svc:15012" || c.CAAddress != "https://istiod.example:15012" {
		t.Errorf("addresses = %q, %q", c.XDSAddress, c.CAAddress)
	}
	if c.WorkloadNamespace != "ns" || c.WorkloadName != "name" || c.WorkloadServiceAccount != "sa" {
		t.Errorf("workload = %q/%q/%q", c.WorkloadNamespace, c.WorkloadName, c.WorkloadServiceAccount)
	}
	if c.ClusterID != "c2" || c.IstioVersion != "1.30.0" {
		t.Errorf("cluster %q version %q", c.ClusterID, c.IstioVersion)
	}
	if c.XDSHeaders["x_test"] != "1" || c.CAHeaders["y"] != "2" || c.MetaJSON["LABELS"] == nil {
		t.Errorf("prefixed = %v %v %v", c.XDSHeaders, c.CAHeaders, c.MetaJSON)
	}
	if c.DrainDeadline != 25*time.Second || c.PacketMark != 0 || c.EnableOrigSrc == nil || *c.EnableOrigSrc {
		t.Errorf("drain %v mark %d origsrc %v", c.DrainDeadline, c.PacketMark, c.EnableOrigSrc)
	}
	if c.KeepaliveEnabled || c.KeepaliveTime != 30*time.Second || c.KeepaliveInterval != time.Minute || c.KeepaliveRetries != 3 {
		t.Errorf("keepalive %v %v %v %d", c.KeepaliveEnabled, c.KeepaliveTime, c.KeepaliveInterval, c.KeepaliveRetries)
	}
	c, err = Load([]string{"INPOD_UDS=/run/cni/zds.sock", "INPOD_PORT_REUSE=false"})
	if err != nil || c.InpodUDS != "/run/cni/zds.sock" || c.InpodPortReuse {
		t.Errorf("INPOD_UDS %q, INPOD_PORT_REUSE %v, %v", c.InpodUDS, c.InpodPortReuse, err)
	}
	for _, tc := range []struct {
		env     []string
		capture bool
		listen  string
	}{
		{[]string{"ISTIO_META_DNS_CAPTURE=TRUE"}, true, "[127.0.0.1:15053 [::1]:15053]"},
		{[]string{"ISTIO_META_DNS_CAPTURE=false"}, false, "[127.0.0.1:15053 [::1]:15053]"},
		{[]string{"ISTIO_META_DNS_CAPTURE=1"}, false, "[127.0.0.1:15053 [::1]:15053]"},
		{[]string{"ISTIO_META_DNS_PROXY_ADDR=localhost:5353", "IPV6_ENABLED=false"}, true, "[127.0.0.1:5353]"},
		{[]string{"ISTIO_META_DNS_PROXY_ADDR=[::1]:53"}, true, "[[::1]:53]"},
	} {
		c, err = Load(tc.env)
		if err != nil || c.DNSCapture != tc.capture || fmt.Sprint(c.DNSListenAddrs()) != tc.listen {
			t.Errorf("Load(%q): DNSCapture %v, DNSListenAddrs %v, %v; want %v, %s", tc.env, c.DNSCapture, c.DNSListenAddrs(), err, tc.capture, tc.listen)
		}
	}
	c, err = Load([]string{"PREFERED_SERVICE_NAMESPACE=istio-system"})
	if err != nil || c.PreferredServiceNamespace != "istio-system" {
		t.Errorf("PREFERED_SERVICE_NAMESPACE = %q, %v", c.PreferredServiceNamespace, err)
	}
	c, err = Load([]string{"XDS_ADDRESS="})
	if err != nil || c.XDSAddress != "" {
		t.Errorf("empty XDS_ADDRESS = %q, %v; want disabled", c.XDSAddress, err)
	}
	c, err = Load([]string{"METRICS_SERIES_GRACE=30s", "METRICS_MAX_SERIES=500"})
	if err != nil || c.MetricsSeriesGrace != 30*time.Second || c.MetricsMaxSeries != 500 {
		t.Errorf("METRICS_SERIES_GRACE %v, METRICS_MAX_SERIES %d, %v; want 30s, 500", c.MetricsSeriesGrace, c.MetricsMaxSeries, err)
	}
	c, err = Load([]string{"ROOT_ROTATION_GRACE=2h"})
	if err != nil || c.RootRotationGrace != 2*time.Hour {
		t.Errorf("ROOT_ROTATION_GRACE = %v, %v; want 2h", c.RootRotationGrace, err)
	}
}

// TestBadValues: each bad value is one error naming the variable.
func TestBadValues(t *testing.T) {
	for _, kv := range []string{
		"PROXY_MODE=sidecar",
		"PROXY_WORKLOAD_INFO=ns/name",
		"SECRET_TTL=-5s",
		"SECRET_TTL=tomorrow",
		"POOL_MAX_STREAMS_PER_CONNECTION=0",
		"METRICS_SERIES_GRACE=0s",
		"METRICS_MAX_SERIES=-1",
		"ROOT_ROTATION_GRACE=0s",
		"HTTP2_STREAM_WINDOW_SIZE=0",
		"HTTP2_FRAME_SIZE=1000",
		"ENABLE_ORIG_SRC=maybe",
		"PACKET_MARK=x",
		"INSTANCE_IP=not-an-ip",
		"XDS_ADDRESS=http://istiod:15010",
		"LOG_FORMAT=xml",
		"FAKE_CA=true",
		"TERMINATION_GRACE_PERIOD_SECONDS=-1",
		"ISTIO_METAJSON_X={bad",
		"LOCAL_XDS_PATH=/a",
		"KEEPALIVE_ENABLED=sometimes",
		"KEEPALIVE_TIME=0s",
		"KEEPALIVE_INTERVAL=3",
		"KEEPALIVE_RETRIES=-1",
		"INPOD_PORT_REUSE=perhaps",
		"ISTIO_META_DNS_PROXY_ADDR=not-an-address",
		"ISTIO_META_DNS_PROXY_ADDR=localhost:http",
		"ENABLE_PROXY=maybe",
		"ENABLE_PROXY=false", // with DNS_CAPTURE off, below
		"ENABLE_RESPONSE_BAGGAGE=yes please",
		"USER_TIMEOUT_ENABLED=on",
		"AUTHZ_POLICY_INFO_LOGGING=verbose",
		"TLS12_ENABLED=1.2",
		"IPV6_ENABLED=dual",
		"COMPLIANCE_POLICY=fips-140-3",
		"COMPLIANCE_POLICY=fips-140-2", // Go's FIPS mode is off in tests
		"CA_ADDRESS=",
		"CA_ADDRESS=http://istiod:15010",
		"PROXY_CONFIG={concurrency: [",
		"PROXY_CONFIG={\"concurrency\": -1}",
		"PROXY_CONFIG=proxyAdminPort: 70000",
		"PROXY_CONFIG=discoveryAddress: http://istiod:15010",
	} {
		env := []string{kv}
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PROXY_WORKLOAD_INFO":
			env = append(env, "PROXY_MODE=dedicated")
		case "LOCAL_XDS_PATH":
			env, name = append(env, "LOCAL_XDS=workloads: []"), "LOCAL_XDS"
		case "PROXY_CONFIG":
			if strings.Contains(kv, "discoveryAddress") {
				name = "discoveryAddress"
			}
		case "ENABLE_PROXY":
			env = append(env, "ISTIO_META_DNS_CAPTURE=false")
		}
		if fips140Enabled() && kv == "COMPLIANCE_POLICY=fips-140-2" {
			continue // a test binary run with GODEBUG=fips140=on
		}
		_, err := Load(env)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), name+":") || strings.Contains(err.Error(), "\n") {
			t.Errorf("Load(%q) error = %v, want one line naming %s", env, err, name)
		}
	}
}

// local is what TestLoadLocal checks of LoadLocal's Config.
type local struct {
	DrainDeadline time.Duration
	LogFormat     string
}

// TestLoadLocal: gozt local reads the drain deadline and LOG_FORMAT by
// Load's rules, with its errors.
func TestLoadLocal(t *testing.T) {
	for _, tc := range []struct {
		deadline, grace, format string
		want                    local
		wantErr                 string // in the error, "" for none
	}{
		{want: local{5 * time.Second, "plain"}},
		{deadline: "2s", grace: "30", format: "json", want: local{2 * time.Second, "json"}},
		{grace: "30", want: local{25 * time.Second, "plain"}},
		{grace: "10", want: local{9 * time.Second, "plain"}},
		{grace: "1", want: local{time.Second, "plain"}},
		{grace: "x", wantErr: "TERMINATION_GRACE_PERIOD_SECONDS"},
		{deadline: "soon", wantErr: "CONNECTION_TERMINATION_DEADLINE"},
		{format: "JSON", wantErr: "LOG_FORMAT"},
	} {
		env := []string{"CONNECTION_TERMINATION_DEADLINE=" + tc.deadline, "TERMINATION_GRACE_PERIOD_SECONDS=" + tc.grace}
		if tc.format != "" {
			env = append(env, "LOG_FORMAT="+tc.format)
		}
		c, err := LoadLocal(env)
		got := local{c.DrainDeadline, c.LogFormat}
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("LoadLocal(%q) = %+v, %v; want an error naming %s", env, got, err, tc.wantErr)
			}
		case err != nil || got != tc.want:
			t.Errorf("LoadLocal(%q) = %+v, %v; want %+v", env, got, err, tc.want)
		}
	}
}

// TestLoadLocalDefaults: gozt local runs with gozt proxy's defaults,
// whatever else environ says, except for NETWORK, SOCKS5 (on) and the
// packet mark (none).
func TestLoadLocalDefaults(t *testing.T) {
	c, err := LoadLocal([]string{"NETWORK=n1", "ENABLE_ORIG_SRC=true", "PACKET_MARK=7", "UNSTABLE_ENABLE_SOCKS5=false"})
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.ProxyMode, want.Network, want.EnableSOCKS5, want.PacketMark = ModeLocal, "n1", true, 0
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("LoadLocal (-want +got):\n%s", diff)
	}
}
