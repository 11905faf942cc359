package dns

import (
	"net"
	"sync"
	"time"
)

// A server's TCP listeners hand miekg/dns only the connections admission
// control admits (ServerConfig.AdmitTCP) and the server has room for
// (ServerConfig.MaxTCPConns), issue 36 item 5. Without the bound, one pod
// could open connections until the node-wide process ran out of
// descriptors, each held for the request timeout; without admission, the
// DNS port would accept while every other listener sheds.

// defaultMaxTCPConns is MaxTCPConns when zero: a stub resolver opens a TCP
// connection only to retry a truncated answer, and each lasts at most one
// request timeout idle, so a pod that needs more than 64 at once is
// flooding.
const defaultMaxTCPConns = 64

// refusedLogEvery rate-limits the log line of refused connections.
const refusedLogEvery = time.Second

// boundedListener accepts connections while fewer than cap(slots) are
// open and resets, at once, every one accepted past that.
type boundedListener struct {
	net.Listener // admitted by AdmitTCP, if set
	slots        chan struct{}
	refused      func() // counts and logs one refused connection
}

// Accept returns the next connection there is room for; it holds a slot
// until it is closed. Its errors are the wrapped listener's.
func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, slots: l.slots}, nil
		default:
			// Counted first, so that whoever sees the reset finds it counted.
			l.refused()
			resetConn(c)
		}
	}
}

// slotConn is an accepted connection holding one slot of its listener
// until its first Close, which miekg/dns always makes.
type slotConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}

// resetConn closes c with a reset (SO_LINGER 0): its client learns at once
// that it was refused, and the closed socket does not wait in TIME_WAIT.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// tcpListener returns l as miekg/dns serves it: admitted, then bounded.
func (s *Server) tcpListener(l net.Listener) net.Listener {
	if s.cfg.AdmitTCP != nil {
		l = s.cfg.AdmitTCP(l)
	}
	return &boundedListener{Listener: l, slots: s.tcpSlots, refused: s.refuseTCP}
}

// refuseTCP counts a connection refused for lack of room and logs it, at
// most once per refusedLogEvery.
func (s *Server) refuseTCP() {
	s.cfg.Resolver.cfg.Metrics.tcpRefused.Inc()
	now := time.Now().UnixNano()
	last := s.refusedLog.Load()
	if now-last >= int64(refusedLogEvery) && s.refusedLog.CompareAndSwap(last, now) {
		s.log.Warn("dns proxy: TCP connections refused: too many open", "limit", cap(s.tcpSlots))
	}
}
