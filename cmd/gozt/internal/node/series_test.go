package node

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gozt/gozt/xds"
)

// TestSeriesOfRemovedWorkload: with METRICS_SERIES_GRACE, the client's
// traffic series to a workload istiod removes leave its /metrics once the
// grace has passed, and gozt_metrics_series_dropped_total is scraped.
func TestSeriesOfRemovedWorkload(t *testing.T) {
	nextNet++
	ip := func(host int) string { return fmt.Sprintf("127.88.%d.%d", nextNet, host) }
	clientIP, serverIP := ip(2), ip(3)
	cp := newControlPlane(t)
	client := cp.startNodeEnv(t, "client", clientIP, "METRICS_SERIES_GRACE=50ms")
	cp.startNode(t, "server", serverIP)
	echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))
	if err := socksPing(clientIP, serverIP+":8080"); err != nil {
		t.Fatal(err)
	}
	url := "http://" + client.MetricsAddr().String() + "/metrics"
	const series = `istio_tcp_connections_opened_total{connection_security_policy="mutual_tls"`
	waitFor(t, func() bool { return strings.Contains(get(t, url), series) }, "the client's series to the server")
	if m := get(t, url); !strings.Contains(m, "gozt_metrics_series_dropped_total 0") {
		t.Errorf("no gozt_metrics_series_dropped_total at 0:\n%s", grepLines(m, "gozt_metrics"))
	}
	cp.xds.Remove(xds.AddressTypeURL, "Kubernetes//Pod/demo/server")
	waitFor(t, func() bool { return !strings.Contains(get(t, url), series) }, "the series to the removed server to go")
}
