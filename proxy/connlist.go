package proxy

import "sync"

// ConnJSON is one live connection of a pod's proxy in /config_dump's
// workloadState, in the shape `istioctl ztunnel-config connections` reads
// (SPEC §8.2).
type ConnJSON struct {
	Src string `json:"src"`
	// OriginalDst is where the client sent the connection: the CONNECT
	// authority of inbound HBONE, the original destination of captured
	// traffic.
	OriginalDst string `json:"originalDst"`
	// ActualDst is where the proxy sent it: the local workload inbound, the
	// HBONE peer or the passthrough target outbound.
	ActualDst string `json:"actualDst"`
	Protocol  string `json:"protocol"` // TCP or HBONE
}

// liveConns is the set of a proxy's open connection records, kept only when
// Config.ListConnections is set.
type liveConns struct {
	m sync.Map // *connRecord → ConnJSON
}

// add lists rec until its close. Callers check Config.ListConnections
// first, so the addresses are formatted only when the list is kept.
func (l *liveConns) add(rec *connRecord, c ConnJSON) {
	rec.live = l
	l.m.Store(rec, c)
}

func (l *liveConns) remove(rec *connRecord) { l.m.Delete(rec) }

// Connections returns the proxy's open connections, inbound and outbound
// (nil unless Config.ListConnections).
func (p *Proxy) Connections() (inbound, outbound []ConnJSON) {
	inbound, outbound = []ConnJSON{}, []ConnJSON{}
	p.live.m.Range(func(k, v any) bool {
		if k.(*connRecord).inbound {
			inbound = append(inbound, v.(ConnJSON))
		} else {
			outbound = append(outbound, v.(ConnJSON))
		}
		return true
	})
	return inbound, outbound
}
