// Package inpod is ztunnel's in-pod ("shared") mode workload manager: a
// client of istio-cni's ZDS protocol (SPEC §9) that starts and stops one
// set of proxies per pod, each with its sockets inside the pod's network
// namespace.
//
// istio-cni listens on a unix SOCK_SEQPACKET socket (Config.Path). A
// Manager connects, says hello, and then answers every request with exactly
// one Ack: AddWorkload hands over the pod's netns as an SCM_RIGHTS file
// descriptor and the Manager calls Config.Start with it; DelWorkload stops
// the pod's proxies at once. Each connection opens with a snapshot (Add or
// Keep for every pod istio-cni knows, then SnapshotSent), after which pods
// the snapshot did not name are stopped. Pods survive a lost connection;
// the next snapshot reconciles them.
//
// Usage, as cmd/gozt wires it:
//
//	m, err := inpod.New(inpod.Config{
//		Path:       os.Getenv("INPOD_UDS"),
//		Start:      startPodProxies, // binds the pod's listeners inside ns.Run
//		Logger:     log,
//		Registerer: reg,
//		OnReady:    func(ready bool) { readiness.Set("workload proxy manager", ready) },
//	})
//	if err != nil { ... }
//	if err := m.Run(ctx); err != nil { // errors.Is(err, inpod.ErrProtocol)
//		os.Exit(1)
//	}
//
// Who may import it: the proxy package and cmd/gozt (deps_test.go). The
// inpodtest subpackage is a fake istio-cni for tests.
package inpod
