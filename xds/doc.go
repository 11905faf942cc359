// Package xds feeds the node's state (proxy/state) from the control plane:
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
// xds imports proxy/state, rbac and certs/identity, never proxy, hbone or
// certs.
package xds
