// Package state holds the node's view of the mesh: workloads, services and
// authorization policies, as delivered by xDS or the local config file
// (SPEC §5.3–5.5), with the indexes the data path needs (SPEC §3.3–3.5).
//
// One writer at a time changes the state through Store.Update, which applies
// a Batch of changes and publishes one new immutable Snapshot with an atomic
// pointer swap. Readers call Store.Snapshot and never lock; a Snapshot they
// hold is never changed by later updates. Lookups on a Snapshot
// (WorkloadByIP, ServiceByVIP, ...) allocate nothing.
//
// Typical use:
//
//	st := state.NewStore(state.Config{})
//	st.Update(func(b *state.Batch) {
//		_ = b.InsertWorkload(w)
//		_ = b.InsertService(svc)
//	})
//	snap := st.Snapshot()
//	if wl := snap.WorkloadByIP("", ip); wl != nil { ... }
//
// Values handed to the store (workloads, services, policies) are owned by
// the store afterwards and must not be modified by the caller; values read
// from a Snapshot are shared and must be treated as read-only.
//
// state imports only rbac and certs/identity; xds writes into it and
// proxy reads from it.
package state
