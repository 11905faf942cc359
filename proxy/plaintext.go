package proxy

import (
	"net"

	"github.com/gozt/gozt/proxy/connmgr"
	"github.com/gozt/gozt/proxy/relay"
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
	return up, func(res relay.Result, err error) { rec.close(res.AToB, res.BToA, done(err)) }
}

// acceptPlaintext authorizes the connection and dials its upstream; a nil
// conn means it was refused (and logged).
func (p *Proxy) acceptPlaintext(c net.Conn) (net.Conn, *connRecord, func(error) error) {
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
	labels := trafficLabels{reporter: "destination", responseFlags: flagNone, securityPolicy: securityUnknown}
	// The destination principal is the local workload's identity, though
	// no certificate was presented, as ztunnel's inbound passthrough names
	// it (SPEC §7.1).
	labels.setDestination(local)
	if w := snap.WorkloadByIP(p.cfg.Network, src.Addr()); w != nil {
		labels.setSource(w)
	}
	authz := rbac.Conn{Src: src, Dst: dst}
	decision := evaluate(snap, local, authz)
	p.logAuthz(decision, authz)
	err := decisionErr(decision)
	var up net.Conn
	if err != nil {
		labels.responseFlags = flagDeny
		p.noteDenial(snap, local, ViaTCP, authz, err)
	} else if up, err = p.dialSpoofed(src.Addr(), dst); err != nil {
		labels.responseFlags = flagConnect
	}
	rec := p.cfg.Metrics.openConn(p.accessLog, labels, true, src, dst, "")
	if err != nil {
		rec.close(0, 0, err)
		return nil, nil, nil
	}
	if p.cfg.ListConnections {
		p.live.add(rec, connAddrs{src: src, originalDst: dst, actualDst: dst, protocol: "TCP"})
		p.live.bind(rec, c)
	}
	done := p.watchPolicy(connmgr.Info{WorkloadUID: local.UID, Conn: authz, Inbound: connmgr.InboundTCP, Checked: snap}, rec, c, up)
	return up, rec, done
}
