// Package connmgr tracks the node's live inbound connections and re-checks
// them against L4 authorization whenever the mesh state changes, closing
// those a new policy denies (SPEC §4.4, TESTPLAN S4).
//
// The inbound proxy registers every connection it admits, HBONE and
// plaintext alike, with the facts authorization needs ([Info]) and a close
// function; it unregisters the connection when it ends. The state writer
// calls [Manager.Notify] after each change; [Manager.Run] re-evaluates every
// tracked connection against the newest snapshot and calls the close
// function of each one now denied with [ErrPolicyChanged]. Connections that
// are still allowed are not touched.
//
// Typical wiring (cmd/gozt):
//
//	cm := connmgr.New(connmgr.Config{Logger: log})
//	st := state.NewStore(state.Config{OnUpdate: func(_, next *state.Snapshot) { cm.Notify(next) }})
//	go cm.Run(ctx)
//	// per admitted inbound connection:
//	unregister := cm.Register(connmgr.Info{WorkloadUID: w.UID, Conn: rc, Inbound: connmgr.InboundHBONE},
//		func(err error) { conn.Close() })
//	defer unregister()
//
// # Guarantees
//
//   - Notify never blocks. Bursts of notifications coalesce: the re-check
//     loop always works on the newest snapshot and skips snapshots it has
//     already checked.
//   - A re-check starts as soon as the loop wakes, with no debounce delay, so
//     a connection denied by a change is closed well within one second.
//   - A connection registered while a change is being applied is not missed:
//     Register evaluates it against the newest notified snapshot and, if that
//     denies it, schedules a re-check that closes it. (The proxy authorized
//     it against the snapshot it held, which may be older.)
//   - A connection whose destination workload is gone from the snapshot is
//     denied (fail closed).
//   - The close function is called at most once, from Run's goroutine. It is
//     not called for a connection unregistered before a re-check decided to
//     close it; if unregister races with that decision, close may run while or
//     just after unregister returns, so it must tolerate a connection that is
//     already closed (closing a net.Conn twice is harmless).
//
// connmgr imports only rbac, state and certs/identity; proxy imports it.
package connmgr
