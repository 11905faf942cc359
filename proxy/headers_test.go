package proxy

import (
	"net/netip"
	"regexp"
	"testing"

	"github.com/gozt/gozt/state"
)

func TestParseAuthority(t *testing.T) {
	for _, tc := range []struct {
		in       string
		wantAddr string
		wantHost string
		wantPort uint16
		wantErr  bool
	}{
		{in: "10.0.0.1:8080", wantAddr: "10.0.0.1:8080", wantPort: 8080},
		{in: "[fd00::1]:80", wantAddr: "[fd00::1]:80", wantPort: 80},
		{in: "[::ffff:10.0.0.1]:80", wantAddr: "10.0.0.1:80", wantPort: 80},
		{in: "echo.demo.svc.cluster.local:80", wantHost: "echo.demo.svc.cluster.local", wantPort: 80},
		{in: "10.0.0.1", wantErr: true},
		{in: "10.0.0.1:0", wantErr: true},
		{in: "10.0.0.1:65536", wantErr: true},
		{in: "10.0.0.1:http", wantErr: true},
		{in: "host:+80", wantErr: true},
		{in: "host", wantErr: true},
		{in: ":80", wantErr: true},
		{in: "", wantErr: true},
		{in: "a..b:80", wantErr: true},
		{in: "bad host:80", wantErr: true},
		{in: "host\x00:80", wantErr: true},
		{in: "[fe80::1%eth0]:80", wantErr: true},
		{in: "fd00::1:80", wantErr: true},
	} {
		got, err := parseAuthority(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseAuthority(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if tc.wantAddr != "" && got.addr.String() != tc.wantAddr {
			t.Errorf("parseAuthority(%q).addr = %v, want %v", tc.in, got.addr, tc.wantAddr)
		}
		if got.host != tc.wantHost || got.port != tc.wantPort {
			t.Errorf("parseAuthority(%q) = host %q port %d, want %q %d", tc.in, got.host, got.port, tc.wantHost, tc.wantPort)
		}
	}
}

// FuzzParseAuthority: no panic, and an accepted authority round-trips
// through String.
func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[::1]:15008", "a.b.c:443", "x:0", "[", "::::", "a:65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseAuthority(s)
		if err != nil {
			return
		}
		if a.port == 0 {
			t.Fatalf("parseAuthority(%q) accepted port 0", s)
		}
		b, err := parseAuthority(a.String())
		if err != nil || b != a {
			t.Fatalf("round trip of %q via %q = %+v, %v; want %+v", s, a.String(), b, err, a)
		}
	})
}

func TestBaggage(t *testing.T) {
	w := &state.Workload{
		Namespace: "demo", ClusterID: "c1", WorkloadName: "client", WorkloadType: state.WorkloadDeployment,
		CanonicalName: "client", CanonicalRevision: "v1", Locality: state.Locality{Region: "r", Zone: "z"},
	}
	want := "k8s.cluster.name=c1,k8s.namespace.name=demo,k8s.deployment.name=client,service.name=client," +
		"service.version=v1,cloud.region=r,cloud.availability_zone=z"
	if got := baggage(w); got != want {
		t.Errorf("baggage = %q, want %q", got, want)
	}
	if got := baggage(&state.Workload{Namespace: "ns"}); got != "k8s.namespace.name=ns" {
		t.Errorf("baggage of sparse workload = %q", got)
	}
}

func TestForwarded(t *testing.T) {
	if got, want := forwarded(netip.MustParseAddrPort("10.0.0.1:5000"), "echo.demo.svc.cluster.local"),
		`for="10.0.0.1:5000";host=echo.demo.svc.cluster.local`; got != want {
		t.Errorf("forwarded = %q, want %q", got, want)
	}
	if got, want := forwarded(netip.MustParseAddrPort("[fd00::1]:5000"), ""), `for="[fd00::1]:5000"`; got != want {
		t.Errorf("forwarded v6 = %q, want %q", got, want)
	}
}

func TestTraceparent(t *testing.T) {
	re := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-00$`)
	a, b := traceparent(), traceparent()
	if !re.MatchString(a) || len(a) != 55 {
		t.Errorf("traceparent = %q, want 00-<32 hex>-<16 hex>-00", a)
	}
	if a == b {
		t.Errorf("two traceparents are equal: %q", a)
	}
}

func TestForwardedHost(t *testing.T) {
	for in, want := range map[string]string{
		`for="10.0.0.1:5000";host=echo.demo.svc.cluster.local`: "echo.demo.svc.cluster.local",
		`for="10.0.0.1:5000";Host="a.b"`:                       "a.b",
		`for="10.0.0.1:5000"`:                                  "",
		`host=caf\u00e9`:                                       `caf\u00e9`,
		"host=caf\u00e9":                                       "",
		"":                                                     "",
	} {
		if got := forwardedHost(in); got != want {
			t.Errorf("forwardedHost(%q) = %q, want %q", in, got, want)
		}
	}
}
