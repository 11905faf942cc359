package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/prometheus/client_golang/prometheus"
)

// TestParseBaggage: the items ztunnel's parse_baggage_header reads, and how
// it reads them.
func TestParseBaggage(t *testing.T) {
	long := strings.Repeat("a", maxBaggageValue+1)
	for _, tc := range []struct {
		name string
		in   []string
		want derivedWorkload
	}{
		{"none", nil, derivedWorkload{}},
		{"all", []string{"k8s.cluster.name=c1,k8s.namespace.name=ns,k8s.deployment.name=wl,service.name=app,service.version=v1,cloud.region=r,cloud.availability_zone=z"},
			derivedWorkload{cluster: "c1", namespace: "ns", workloadName: "wl", service: "app", revision: "v1", region: "r", zone: "z"}},
		{"cronjob", []string{"k8s.cronjob.name=cj"}, derivedWorkload{workloadName: "cj"}},
		{"pod", []string{"k8s.pod.name=p"}, derivedWorkload{workloadName: "p"}},
		{"job", []string{"k8s.job.name=j"}, derivedWorkload{workloadName: "j"}},
		{"daemonset is not read", []string{"k8s.daemonset.name=d"}, derivedWorkload{}},
		{"several fields", []string{"k8s.namespace.name=ns", "service.name=app"}, derivedWorkload{namespace: "ns", service: "app"}},
		{"later wins", []string{"service.name=a,service.name=b"}, derivedWorkload{service: "b"}},
		{"empty value is none", []string{"service.name=a,service.name="}, derivedWorkload{}},
		{"value ends at '='", []string{"service.name=a=b"}, derivedWorkload{service: "a"}},
		{"no '='", []string{"service.name,k8s.namespace.name=ns"}, derivedWorkload{namespace: "ns"}},
		{"spaces are not trimmed", []string{"service.name=a, k8s.namespace.name=ns"}, derivedWorkload{service: "a"}},
		{"unknown keys", []string{"foo=bar,service.name=a"}, derivedWorkload{service: "a"}},
		{"non-ASCII drops all", []string{"service.name=a", "k8s.namespace.name=n\xc3\xa9"}, derivedWorkload{}},
		{"control byte drops all", []string{"service.name=a\x01"}, derivedWorkload{}},
		{"tab is allowed", []string{"service.name=a\tb"}, derivedWorkload{service: "a\tb"}},
		{"too long is dropped", []string{"service.name=" + long + ",k8s.namespace.name=ns"}, derivedWorkload{namespace: "ns"}},
	} {
		if got := parseBaggage(tc.in); got != tc.want {
			t.Errorf("%s: parseBaggage(%q) = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestInboundBaggageSource: the source labels of an inbound connection come
// from the request's baggage when xDS does not know the source, from xDS
// when it does (ztunnel applies the derived source first), and the baggage
// is not read with ENABLE_RESPONSE_BAGGAGE=false; the principal is always
// the peer certificate's.
func TestInboundBaggageSource(t *testing.T) {
	const bag = "k8s.cluster.name=remote,k8s.namespace.name=other-ns,k8s.deployment.name=remote-wl,service.name=remote-app,service.version=v9,cloud.region=r1,cloud.availability_zone=z1"
	for _, tc := range []struct {
		name          string
		unknownClient bool
		noBaggage     bool
		want          map[string]string
	}{
		{"unknown source: baggage", true, false, map[string]string{
			"source_workload": "remote-wl", "source_workload_namespace": "other-ns", "source_canonical_service": "remote-app",
			"source_canonical_revision": "v9", "source_app": "remote-wl", "source_version": "v9", "source_cluster": "remote",
			"source_region": "r1", "source_zone": "z1", "source_principal": ppClientID.String()}},
		{"known source: xDS", false, false, map[string]string{
			"source_workload": "client", "source_workload_namespace": "ns", "source_canonical_service": "client-app",
			"source_app": "client-app", "source_version": "v1", "source_cluster": "c1", "source_region": "unknown",
			"source_principal": ppClientID.String()}},
		{"baggage off", true, true, map[string]string{
			"source_workload": "unknown", "source_workload_namespace": "unknown", "source_canonical_service": "unknown",
			"source_cluster": "unknown", "source_principal": ppClientID.String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			inboundOnceWith(t, inboundOpts{
				cfg:           func(c *Config) { c.Metrics, c.NoResponseBaggage = telemetry.NewMetrics(reg), tc.noBaggage },
				header:        http.Header{"Baggage": {bag}},
				unknownClient: tc.unknownClient,
			})
			labels := counterLabels(t, reg, "istio_tcp_connections_opened_total", "destination")
			for k, want := range tc.want {
				if labels[k] != want {
					t.Errorf("%s = %q, want %q", k, labels[k], want)
				}
			}
		})
	}
}

// FuzzParseBaggage: any header values parse without panic into values that
// hold no item or key separator, are within the bound, and are all empty
// when a byte is outside visible ASCII and tab.
func FuzzParseBaggage(f *testing.F) {
	f.Add("k8s.cluster.name=c1,k8s.namespace.name=ns,k8s.deployment.name=wl", "service.name=a=b")
	f.Add("service.name=", "cloud.region=r\xff")
	f.Fuzz(func(t *testing.T, a, b string) {
		d := parseBaggage([]string{a, b})
		for _, v := range []string{d.cluster, d.namespace, d.workloadName, d.service, d.revision, d.region, d.zone} {
			if strings.ContainsAny(v, ",=") || len(v) > maxBaggageValue {
				t.Fatalf("parseBaggage(%q, %q) = %+v: value %q", a, b, d, v)
			}
		}
		bad := strings.IndexFunc(a+b, func(r rune) bool { return (r < 0x20 || r > 0x7e) && r != '\t' }) >= 0
		if bad && d != (derivedWorkload{}) {
			t.Fatalf("parseBaggage(%q, %q) = %+v, want nothing for a non-ASCII field", a, b, d)
		}
	})
}
