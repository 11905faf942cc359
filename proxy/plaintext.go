package proxy

import (
	"net"

	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/relay"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
)

// handlePlaintext serves a connection captured on 15006: inbound traffic
// without HBONE (SPEC §1.2). It connects to the original destination with
// the client's IP as source and returns that leg with its finish (a
// handler's result).
func (p *Proxy) handlePlaintext(c net.Conn) (net.Conn, func(relay.Result, error)) {
	up, rec, done := p.acceptPlaintext(c)
	if up == nil {
		return nil, nil
	}
	return up, func(res relay.Result, err error) { rec.Close(res.AToB, res.BToA, done(err)) }
}

// acceptPlaintext authorizes the connection and dials its upstream; a nil
// conn means it was refused (and logged).
func (p *Proxy) acceptPlaintext(c net.Conn) (net.Conn, *telemetry.Record, func(error) error) {
	src := addrPortOf(c.RemoteAddr())
	dst := originalDst(c)
	if p.illegal.contains(dst.Port()) {
		p.connFailed(src, dst, "inbound", errSelfCall)
		return nil, nil, nil
	}
	snap, local := p.awaitLocalWorkload(p.lifetime)
	if local == nil {
		p.connFailed(src, dst, "inbound", errNoLocalWorkload)
		return nil, nil, nil
	}
	snap = p.fetchPeer(snap, src) // ztunnel's inbound_passthrough fetches it
	labels := telemetry.Labels{Reporter: "destination", ResponseFlags: telemetry.FlagNone, SecurityPolicy: telemetry.SecurityUnknown}
	// The destination principal is the local workload's identity, though
	// no certificate was presented, as ztunnel's inbound passthrough names
	// it (SPEC §7.1).
	labels.SetDestination(local)
	if w := snap.WorkloadByIP(p.cfg.Network, src.Addr()); w != nil {
		labels.SetSource(w)
	}
	authz := rbac.Conn{Src: src, Dst: dst}
	decision := evaluate(snap, local, authz)
	p.logAuthz(decision, authz)
	err := decisionErr(decision)
	var up net.Conn
	if err != nil {
		labels.ResponseFlags = telemetry.FlagDeny
		p.noteDenial(snap, local, telemetry.ViaTCP, authz, err)
	} else if up, err = p.dialSpoofed(src.Addr(), dst); err != nil {
		labels.ResponseFlags = telemetry.FlagConnect
	}
	rec := p.cfg.Metrics.Open(p.accessLog, labels, true, src, dst, "")
	if err != nil {
		rec.Close(0, 0, err)
		return nil, nil, nil
	}
	if p.cfg.ListConnections {
		p.live.Add(rec, telemetry.ConnAddrs{Src: src, OriginalDst: dst, ActualDst: dst, Protocol: "TCP"})
		p.live.Bind(rec, c)
	}
	done := p.watchPolicy(connmgr.Info{WorkloadUID: local.UID, Conn: authz, Inbound: connmgr.InboundTCP, Checked: snap}, rec, c, up)
	return up, rec, done
}
