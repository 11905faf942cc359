package e2e

import (
	"context"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const connsOpened = "istio_tcp_connections_opened_total"

// TestScenario2 is issue 37's second scenario: in an ambient namespace, a
// client pod reaches a server pod of another service account through the
// server's Service and its pod IP, over HBONE through gozt; the server
// sees the client pod's IP; gozt's metrics and access log name both SPIFFE
// identities with mutual TLS.
func TestScenario2(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s2"
	client, server, svcIP := meshPair(ctx, t, ns)
	clientID, serverID := spiffeID(ns, "client"), spiffeID(ns, "server")
	mtls := map[string]map[string]string{}
	for _, reporter := range []string{"source", "destination"} {
		mtls[reporter] = map[string]string{
			"reporter":                       reporter,
			"source_principal":               clientID,
			"source_workload":                "client",
			"source_workload_namespace":      ns,
			"destination_principal":          serverID,
			"destination_workload":           "server",
			"destination_workload_namespace": ns,
			"connection_security_policy":     "mutual_tls",
		}
	}
	before := goztMetrics(ctx, t)
	start := time.Now()

	for _, tc := range []struct{ name, addr, msg string }{
		{"ClientToService", net.JoinHostPort(svcIP, "80"), "hello-service"},
		{"ClientToPodIP", podAddr(server), "hello-pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustDial(ctx, t, client, tc.addr, tc.msg)
			t.Logf("%s -> %s: %v", client.Status.PodIP, tc.addr, r)
			checkSourcePreserved(t, r, client)
		})
	}
	t.Run("MetricsNameBothIdentities", func(t *testing.T) {
		for _, reporter := range []string{"source", "destination"} {
			// Both dials, at least, are counted on both sides.
			waitMetric(ctx, t, connsOpened, mtls[reporter], metricSum(before, connsOpened, mtls[reporter])+2)
		}
	})
	t.Run("AccessLogNamesBothIdentities", func(t *testing.T) {
		for _, dir := range []string{"inbound", "outbound"} {
			l := waitLogLine(ctx, t, start, "connection complete", logField("src.identity", clientID),
				logField("dst.identity", serverID), logField("direction", dir), "src.addr="+client.Status.PodIP+":")
			t.Logf("gozt: %s", l)
		}
	})
}

// TestScenario3 is issue 37's third scenario: a pod outside the mesh
// reaches an enrolled server in plaintext (through gozt's inbound
// plaintext port 15006, the source address preserved), and an enrolled
// client reaches a server outside the mesh (passthrough).
func TestScenario3(t *testing.T) {
	ctx := context.Background()
	const mesh, plain = "e2e-s3-mesh", "e2e-s3-plain"
	createNamespace(ctx, t, mesh, true)
	createNamespace(ctx, t, plain, false)
	createServiceAccount(ctx, t, mesh, "client")
	createServiceAccount(ctx, t, mesh, "server")
	in := createEchoPods(ctx, t, mesh, map[string]string{"client": "client", "server": "server"}, "client", "server")
	out := createEchoPods(ctx, t, plain, nil, "outside-client", "outside-server")

	t.Run("UnenrolledToEnrolled", func(t *testing.T) {
		want := map[string]string{
			"reporter":                       "destination",
			"source_workload":                "outside-client",
			"source_workload_namespace":      plain,
			"destination_workload":           "server",
			"destination_workload_namespace": mesh,
			"connection_security_policy":     "unknown",
			// The server's identity, as ztunnel's inbound passthrough
			// names it (gozt said "unknown" until this scenario found it).
			"destination_principal": "spiffe://cluster.local/ns/" + mesh + "/sa/server",
		}
		dialCounted(ctx, t, out["outside-client"], in["server"], "hello-plaintext", want)
	})
	t.Run("EnrolledToUnenrolled", func(t *testing.T) {
		want := map[string]string{
			"reporter":                       "source",
			"source_workload":                "client",
			"source_workload_namespace":      mesh,
			"destination_workload":           "outside-server",
			"destination_workload_namespace": plain,
			"connection_security_policy":     "unknown",
		}
		dialCounted(ctx, t, in["client"], out["outside-server"], "hello-passthrough", want)
	})
}

// dialCounted dials the echo port of to from from with msg, checks that the
// server saw from's IP, and waits until gozt has counted one more opened
// connection in the series labelled want.
func dialCounted(ctx context.Context, t *testing.T, from, to *corev1.Pod, msg string, want map[string]string) {
	t.Helper()
	before := metricSum(goztMetrics(ctx, t), connsOpened, want)
	r := mustDial(ctx, t, from, podAddr(to), msg)
	t.Logf("%s -> %s: %v", from.Status.PodIP, podAddr(to), r)
	checkSourcePreserved(t, r, from)
	waitMetric(ctx, t, connsOpened, want, before+1)
}

// checkSourcePreserved fails the test unless the server saw the client
// pod's own IP as the connection's source.
func checkSourcePreserved(t *testing.T, r echoReply, client *corev1.Pod) {
	t.Helper()
	if got := r.PeerIP(); got != client.Status.PodIP {
		t.Errorf("server saw the connection from %s, want the client pod's IP %s (%s/%s)",
			r.Peer, client.Status.PodIP, client.Namespace, client.Name)
	}
}
