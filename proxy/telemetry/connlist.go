package telemetry

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

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
	Protocol  string `json:"protocol"` // TCP, HBONE or DOUBLEHBONE
}

// LiveConn is one open connection in the admin live view: ConnJSON's
// addresses, the workloads and identities on each side, and the bytes
// moved so far.
type LiveConn struct {
	ConnJSON
	Direction   string    `json:"direction"` // inbound or outbound
	SrcWorkload string    `json:"srcWorkload,omitempty"`
	SrcIdentity string    `json:"srcIdentity,omitempty"`
	DstWorkload string    `json:"dstWorkload,omitempty"`
	DstIdentity string    `json:"dstIdentity,omitempty"`
	Start       time.Time `json:"start"`
	// RequestBytes went client → server, ResponseBytes server → client.
	RequestBytes  int64 `json:"requestBytes"`
	ResponseBytes int64 `json:"responseBytes"`
	// BytesLive reports whether the counts follow the flow. A connection
	// spliced TCP to TCP (passthrough, plaintext inbound) is not counted
	// while open, so its splice stays unbounded: counting splits it into
	// 1 MiB calls, which costs 15–30% of passthrough throughput (see
	// relay's spliceChunk). Its bytes show in the metrics at close.
	BytesLive bool `json:"bytesLive"`
}

// ConnList is the set of a proxy's open connection records, kept only when
// the proxy lists its connections (proxy.Config.ListConnections). The zero
// value is an empty list; its methods may be called concurrently.
//
// A connection is added by its handler once its upstream is open (Add), its
// downstream leg is bound to it (Bind), and the hand-off to the relay takes
// its byte counters by that leg (Counters); its record's Close takes it off.
// Nothing of this runs, and the relay counts nothing, when the list is not
// kept.
type ConnList struct {
	m sync.Map // *Record → *liveConn
	// legs holds a listed connection by its downstream leg from Bind until
	// Counters takes it (or the connection closes before).
	legs sync.Map // net.Conn → *liveConn
}

// liveConn is one listed connection. Everything but the counters is set
// before it is published and read-only afterwards. It keeps addresses and
// names as they are and formats them only when a view reads the list
// (conn, live): every connection is listed, and a view is read rarely.
type liveConn struct {
	addrs                   ConnAddrs
	inbound                 bool
	start                   time.Time
	srcNamespace, srcName   string
	srcPrincipal            string
	dstNamespace, dstName   string
	dstPrincipal            string
	down                    net.Conn // bound downstream leg, or nil; the handler's goroutine only
	counted                 atomic.Bool
	requestBytes, respBytes atomic.Int64
}

// ConnAddrs are a listed connection's addresses (ConnJSON's fields).
type ConnAddrs struct {
	Src, OriginalDst, ActualDst netip.AddrPort
	// Authority, if not empty, is the original destination instead of
	// OriginalDst: the CONNECT authority of inbound HBONE.
	Authority string
	Protocol  string // TCP, HBONE or DOUBLEHBONE
}

// Add lists rec until its Close. Callers check that the list is kept
// first.
func (l *ConnList) Add(rec *Record, a ConnAddrs) {
	lb := &rec.s.labels
	e := &liveConn{addrs: a, inbound: rec.inbound, start: rec.start,
		srcNamespace: lb.SrcNamespace, srcName: lb.SrcWorkload, srcPrincipal: lb.SrcPrincipal,
		dstNamespace: lb.DstNamespace, dstName: lb.DstWorkload, dstPrincipal: lb.DstPrincipal,
	}
	rec.live = l
	l.m.Store(rec, e)
}

// conn formats e's addresses for /config_dump.
func (e *liveConn) conn() ConnJSON {
	c := ConnJSON{Src: e.addrs.Src.String(), OriginalDst: e.addrs.Authority, ActualDst: e.addrs.ActualDst.String(), Protocol: e.addrs.Protocol}
	if c.OriginalDst == "" {
		c.OriginalDst = e.addrs.OriginalDst.String()
	}
	return c
}

// live formats e for the live view, with its byte counts now.
func (e *liveConn) live() LiveConn {
	c := LiveConn{ConnJSON: e.conn(), Direction: "outbound", Start: e.start,
		SrcWorkload: joinName(e.srcNamespace, e.srcName), SrcIdentity: e.srcPrincipal,
		DstWorkload: joinName(e.dstNamespace, e.dstName), DstIdentity: e.dstPrincipal,
		RequestBytes: e.requestBytes.Load(), ResponseBytes: e.respBytes.Load(), BytesLive: e.counted.Load(),
	}
	if e.inbound {
		c.Direction = "inbound"
	}
	return c
}

func joinName(ns, name string) string {
	if name == "" {
		return ""
	}
	return ns + "/" + name
}

// Bind ties rec's listed connection to its downstream leg, the conn the
// proxy hands to the relay with it. It does nothing for a record that is not
// listed.
func (l *ConnList) Bind(rec *Record, down net.Conn) {
	if rec == nil || rec.live == nil {
		return
	}
	if v, ok := l.m.Load(rec); ok {
		e := v.(*liveConn)
		e.down = down
		l.legs.Store(down, e)
	}
}

// PreCount adds n request bytes to rec's listed connection, if it is
// listed: the bytes sent with the CONNECT, before the relay's counting.
func (l *ConnList) PreCount(rec *Record, n int64) {
	if n == 0 || rec == nil || rec.live == nil {
		return
	}
	if v, ok := l.m.Load(rec); ok {
		v.(*liveConn).requestBytes.Add(n)
	}
}

// Counters returns the live byte counters of the listed connection whose
// downstream leg is down, for relay's Poller.Start; nil when it is not
// listed, or when both legs are TCP sockets the relay splices (see
// LiveConn.BytesLive).
func (l *ConnList) Counters(down, up net.Conn) (request, response *atomic.Int64) {
	v, ok := l.legs.LoadAndDelete(down)
	if !ok {
		return nil, nil
	}
	_, downTCP := down.(*net.TCPConn)
	_, upTCP := up.(*net.TCPConn)
	if downTCP && upTCP {
		return nil, nil
	}
	e := v.(*liveConn)
	e.counted.Store(true)
	return &e.requestBytes, &e.respBytes
}

func (l *ConnList) remove(rec *Record) {
	if v, ok := l.m.LoadAndDelete(rec); ok {
		if e := v.(*liveConn); e.down != nil {
			l.legs.CompareAndDelete(e.down, e)
		}
	}
}

// Conns returns the listed connections, inbound and outbound.
func (l *ConnList) Conns() (inbound, outbound []ConnJSON) {
	inbound, outbound = []ConnJSON{}, []ConnJSON{}
	l.m.Range(func(_, v any) bool {
		if e := v.(*liveConn); e.inbound {
			inbound = append(inbound, e.conn())
		} else {
			outbound = append(outbound, e.conn())
		}
		return true
	})
	return inbound, outbound
}

// Live appends to dst at most max of the listed connections, with their
// byte counts now, and returns it with how many are listed in all.
func (l *ConnList) Live(dst []LiveConn, max int) ([]LiveConn, int) {
	total := 0
	l.m.Range(func(_, v any) bool {
		total++
		if max <= 0 {
			return true
		}
		max--
		dst = append(dst, v.(*liveConn).live())
		return true
	})
	return dst, total
}
