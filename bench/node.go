package bench

import (
	"fmt"
	"net/netip"

	"istio.io/istio/pkg/workloadapi"
)

// The node scenario (issue 40): one gozt in shared mode, `gozt proxy` as the
// DaemonSet runs it, serving a node's worth of pods (the kubelet's default
// cap, 110), each a network namespace handed over through ZDS with its
// listeners, certificate and DNS proxy, the fake istiod holding their
// workloads. The Linux side is node_linux.go; elsewhere it is skipped.
//
// Topology. The harness makes every namespace itself (unshare(2) on a
// locked thread, the loopback brought up, a descriptor kept; nothing is
// mounted, so nothing outlives the run): one for the node, where gozt and
// the fake istiod (the xds role with --ca) run, and one per pod. gozt
// reaches istiod on the node's loopback and istio-cni (the harness,
// proxy/inpod/inpodtest) on a unix socket. Pod i has the address
// nodePodIP(i) in xDS; inside its own namespace the whole 127/8 is local, so
// a client there reaches its pod's SOCKS5 port at 127.0.0.1:15080, gozt's
// outbound connects the HBONE tunnel to nodePodIP(i):15008 (the same pod's
// inbound listener) and the inbound dials the pod's test server, which the
// harness runs in the pod's namespace. The whole mesh path runs per pod,
// with each pod's own certificate, pool and lookups.

// nodeTitle is the node scenario's Result.Scenario.
const nodeTitle = "node, 110 pods"

// nodePods is how many pods the scenario hands to gozt: the kubelet's
// default maximum per node.
const nodePods = 110

const (
	nodeName  = "bench-node"
	nodePodNS = "bench-node"
)

// nodePodIP is pod i's address: 127.90.x.y, distinct per pod.
func nodePodIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 90, byte(i / 250), byte(i%250 + 1)})
}

func nodePodName(i int) string { return fmt.Sprintf("pod-%03d", i) }

// nodePodUID is pod i's ZDS uid.
func nodePodUID(i int) string { return fmt.Sprintf("bench-pod-uid-%03d", i) }

// nodePodSA is pod i's service account: one per pod, so that every pod
// has a certificate of its own.
func nodePodSA(i int) string { return fmt.Sprintf("sa-%03d", i) }

// nodePodWorkload is pod i's workload as the fake istiod holds it, on node.
func nodePodWorkload(i int, node string) *workloadapi.Workload {
	ip := nodePodIP(i).As4()
	name := nodePodName(i)
	return &workloadapi.Workload{
		Uid:               "Kubernetes//Pod/" + nodePodNS + "/" + name,
		Name:              name,
		Namespace:         nodePodNS,
		Addresses:         [][]byte{ip[:]},
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		TrustDomain:       trustDom,
		ServiceAccount:    nodePodSA(i),
		Node:              node,
		CanonicalName:     name,
		CanonicalRevision: "v1",
		WorkloadType:      workloadapi.WorkloadType_POD,
		WorkloadName:      name,
		ClusterId:         "Kubernetes",
		Status:            workloadapi.WorkloadStatus_HEALTHY,
	}
}
