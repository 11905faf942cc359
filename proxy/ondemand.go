package proxy

import (
	"net/http"
	"net/netip"

	"golang.org/x/time/rate"

	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// This file fetches, with on-demand xDS (Config.Demand), what a connection's
// decision will look up and the snapshot lacks, before the pure decision
// (route.go, inbound_decide.go) runs on a newer snapshot. Each fetch only
// reads the snapshot when what it looks for is there; only a miss with
// Config.Demand set waits, for at most the demander's bound. A demand that
// fails (no answer in time, the proxy stopping) counts as a miss: the
// decision then runs as it would for an unknown address.

// DemandLimits bounds one proxy's on-demand fetches, so that a peer (any
// mTLS client of an inbound listener) or the workload itself, naming
// address after unknown address, costs istiod and this process a bounded
// number of requests: a token bucket of Rate fetches per second holding
// Burst, and at most Outstanding fetches waiting for an answer at once.
// A fetch past either bound is not sent; the connection's decision runs as
// it would after a miss. Zero fields take the defaults.
type DemandLimits struct {
	Rate        float64 // fetches per second; if zero 50
	Burst       int     // if zero 100
	Outstanding int     // if zero 64
}

// Default on-demand limits: far above what a workload meets in steady state
// (one fetch per address it has not reached before), far below a flood.
const (
	defaultDemandRate        = 50
	defaultDemandBurst       = 100
	defaultDemandOutstanding = 64
)

// demandGate enforces a proxy's DemandLimits.
type demandGate struct {
	tokens *rate.Limiter
	slots  chan struct{} // one per fetch waiting for its answer
}

func newDemandGate(l DemandLimits) *demandGate {
	if l.Rate <= 0 {
		l.Rate = defaultDemandRate
	}
	if l.Burst <= 0 {
		l.Burst = defaultDemandBurst
	}
	if l.Outstanding <= 0 {
		l.Outstanding = defaultDemandOutstanding
	}
	return &demandGate{tokens: rate.NewLimiter(rate.Limit(l.Rate), l.Burst), slots: make(chan struct{}, l.Outstanding)}
}

// enter takes a slot and a token for one fetch, or returns the reason it
// may not run; release gives the slot back.
func (g *demandGate) enter() (refused string) {
	select {
	case g.slots <- struct{}{}:
	default:
		return telemetry.DemandRefusedOutstanding
	}
	if !g.tokens.Allow() {
		<-g.slots
		return telemetry.DemandRefusedRate
	}
	return ""
}

func (g *demandGate) release() { <-g.slots }

// demand fetches key, within the proxy's DemandLimits, and returns the
// store's newest snapshot.
func (p *Proxy) demand(key string) *state.Snapshot {
	if reason := p.demands.enter(); reason != "" {
		p.cfg.Metrics.DemandRefusals(reason).Inc()
		p.log.Debug("on-demand xDS lookup refused", "name", key, "over", reason)
		return p.cfg.Store.Snapshot()
	}
	defer p.demands.release()
	if err := p.cfg.Demand.Demand(p.lifetime, key); err != nil {
		p.log.Debug("on-demand xDS lookup failed", "name", key, "error", err)
	}
	return p.cfg.Store.Snapshot()
}

// fetchOutbound makes snap hold what an outbound decision from src to dst
// reads: the destination by network/IP, as ztunnel's fetch_upstream does
// (fetch_address), then the waypoints of the destination workload or
// service and the destination workload's network gateway, with the
// workloads behind them by uid (ztunnel's check_from_waypoint, which
// fetches the workload's waypoint with fetch_destination and its endpoints
// with fetch_workload_by_uid). ztunnel looks up service waypoints and
// network gateways without fetching; gozt fetches them too, since with
// on-demand they are otherwise unknown until something else asks.
func (p *Proxy) fetchOutbound(snap *state.Snapshot, src *state.Workload, dst netip.AddrPort) *state.Snapshot {
	if p.cfg.Demand == nil {
		return snap
	}
	ip := dst.Addr().Unmap()
	w := snap.WorkloadByIP(p.cfg.Network, ip)
	var svc *state.Service
	if w == nil {
		if svc = snap.ServiceByVIP(p.cfg.Network, ip, src.Namespace); svc == nil {
			snap = p.demand(state.AddressKey(p.cfg.Network, ip))
			if w = snap.WorkloadByIP(p.cfg.Network, ip); w == nil {
				svc = snap.ServiceByVIP(p.cfg.Network, ip, src.Namespace)
			}
		}
	}
	switch {
	case w != nil:
		snap = p.fetchGateway(snap, w.Waypoint, src.Namespace)
		snap = p.fetchGateway(snap, w.NetworkGateway, src.Namespace)
	case svc != nil:
		snap = p.fetchGateway(snap, svc.Waypoint, src.Namespace)
		for i := range svc.WeightedWaypoints {
			snap = p.fetchGateway(snap, &svc.WeightedWaypoints[i].Destination, src.Namespace)
		}
	}
	return snap
}

// fetchGateway makes snap hold what gw (a waypoint or gateway, or nil)
// names, as ztunnel's fetch_destination finds it: an address is a
// workload's IP or a service VIP ("network/IP"), a hostname a service or a
// workload hostname ("namespace/hostname"); and, for a service, the
// workloads of its endpoints by uid.
func (p *Proxy) fetchGateway(snap *state.Snapshot, gw *state.GatewayAddress, ns string) *state.Snapshot {
	var svc *state.Service
	switch {
	case gw == nil:
		return snap
	case gw.Address != nil:
		n, ip := gw.Address.Network, gw.Address.Address.Unmap()
		if snap.WorkloadByIP(n, ip) != nil {
			return snap
		}
		if svc = snap.ServiceByVIP(n, ip, ns); svc == nil {
			snap = p.demand(state.AddressKey(n, ip))
			svc = snap.ServiceByVIP(n, ip, ns)
		}
	case gw.Hostname != nil:
		key := state.HostnameKey(gw.Hostname.Namespace, gw.Hostname.Hostname)
		if svc = snap.ServiceByKey(key); svc == nil {
			if snap.WorkloadByHostname(gw.Hostname.Namespace, gw.Hostname.Hostname) != nil {
				return snap
			}
			snap = p.demand(key)
			svc = snap.ServiceByKey(key)
		}
	}
	if svc == nil {
		return snap
	}
	for uid := range svc.Endpoints.UIDs() {
		if snap.WorkloadByUID(uid) == nil {
			snap = p.demand(uid)
		}
	}
	return snap
}

// fetchInbound makes snap hold what an inbound HBONE decision reads and
// may miss: the peer's workload by address, unless the request came
// through a gateway from another network (ztunnel's
// fetch_workload_by_address in Inbound::build_inbound_request), and the
// workload or service at an authority IP other than the one the
// connection reached, which validate_destination fetches on demand to see
// whether the local workload is its waypoint. A request that the checks
// needing no state refuse (a method other than CONNECT, an authority that
// does not parse: decideConnect's steps 1 and 2) fetches nothing, so that
// it costs istiod nothing either.
func (p *Proxy) fetchInbound(snap *state.Snapshot, src, l3dst netip.AddrPort, method, rawAuthority string, viaGateway bool) *state.Snapshot {
	if p.cfg.Demand == nil || method != http.MethodConnect {
		return snap
	}
	auth, err := parseAuthority(rawAuthority)
	if err != nil {
		return snap
	}
	if !viaGateway {
		snap = p.fetchPeer(snap, src)
	}
	local := p.localWorkload(snap)
	if auth.host != "" || local == nil || local.ApplicationTunnel != nil {
		return snap
	}
	target := auth.addr.Addr()
	if target == l3dst.Addr() || snap.WorkloadByIP(p.cfg.Network, target) != nil ||
		snap.ServiceByVIP(p.cfg.Network, target, local.Namespace) != nil {
		return snap
	}
	return p.demand(state.AddressKey(p.cfg.Network, target))
}

// fetchPeer makes snap hold the workload at a connection's peer address
// (ztunnel's fetch_workload_by_address), with Config.Demand set.
func (p *Proxy) fetchPeer(snap *state.Snapshot, src netip.AddrPort) *state.Snapshot {
	if p.cfg.Demand == nil || snap.WorkloadByIP(p.cfg.Network, src.Addr()) != nil {
		return snap
	}
	return p.demand(state.AddressKey(p.cfg.Network, src.Addr()))
}
