// Package xds feeds the node's state (package state) from the control plane:
// Istio's workload and authorization resources (SPEC §5), and the local
// static config file that replaces xDS for `gozt local` and tests (SPEC §5.5).
//
// The local config is parsed once with ParseLocalConfig or LoadLocalConfig
// and applied to a store in one batch:
//
//	cfg, err := xds.LoadLocalConfig(path)
//	if err != nil {
//		return err // one line: file:line:col: key.path: reason
//	}
//	var applyErr error
//	store.Update(func(b *state.Batch) { applyErr = cfg.Apply(b) })
//
// The delta ADS client (SPEC §5.1) subscribes to istio.workload.Address and
// istio.security.Authorization, converts and validates each resource once,
// off the store lock, applies a push in one batch, NACKs invalid resources
// one by one and reconnects with the versions it holds:
//
//	c, err := xds.NewClient(xds.Config{Address: "https://istiod:15012", TLS: tlsCfg, Store: store,
//		Node: xds.BuildNode(xds.NodeInfo{PodName: pod, PodNamespace: ns})})
//	go c.Run(ctx)
//	<-c.Ready() // the first response of each type has been applied and ACKed
//
// Package xdsserver is the matching in-process fake istiod; tests use it
// through xdstest.
//
// xds imports state, rbac and certs/identity, never proxy, hbone or
// certs.
package xds
