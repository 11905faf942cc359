package proxy

import (
	"errors"
	"time"

	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// This file records, in the process's telemetry.Denials, the connections
// authorization refused.

// noteInboundDenial records an inbound HBONE CONNECT that authorization
// refused (SPEC §2.4 step 6); other refusals are not denials.
func (p *Proxy) noteInboundDenial(req *inboundRequest, ierr *inboundError) {
	if ierr == nil || p.cfg.Denials == nil {
		return
	}
	p.noteDenial(req.snap, req.local, telemetry.ViaHBONE, req.authz, ierr.err)
}

// noteDenial records c, for the local workload, if err is authorization's
// refusal. The decision is evaluated again on the snapshot that refused,
// for its policy and rule: this costs a second evaluation, on denials only,
// and leaves the authorization path as it is.
func (p *Proxy) noteDenial(snap *state.Snapshot, local *state.Workload, via string, c rbac.Conn, err error) {
	if p.cfg.Denials == nil || local == nil || !errors.Is(err, errDenied) {
		return
	}
	t := rbac.Target{Namespace: local.Namespace, PolicyRefs: local.AuthorizationPolicies}
	p.cfg.Denials.Record(telemetry.NewDenial(local, via, c, rbac.Evaluate(snap, t, c)))
}

// noteRecheckDenial records a live connection that a policy change closed.
// The connection manager decided on the snapshot it checked; the deciding
// policy and rule are found again on the current one, which is that
// snapshot or a later one.
func (p *Proxy) noteRecheckDenial(info connmgr.Info) {
	if p.cfg.Denials == nil {
		return
	}
	snap := p.cfg.Store.Snapshot()
	local := snap.WorkloadByUID(info.WorkloadUID)
	if local == nil {
		p.cfg.Denials.Record(telemetry.Denial{Time: time.Now(), WorkloadUID: info.WorkloadUID, Via: telemetry.ViaPolicyChange,
			Src: info.Conn.Src, SrcIdentity: telemetry.Principal(info.Conn.Identity), Dst: info.Conn.Dst, Rule: -1,
			Reason: "destination workload removed"})
		return
	}
	t := rbac.Target{Namespace: local.Namespace, PolicyRefs: local.AuthorizationPolicies}
	p.cfg.Denials.Record(telemetry.NewDenial(local, telemetry.ViaPolicyChange, info.Conn, rbac.Evaluate(snap, t, info.Conn)))
}
