package dns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/proxy/admission"
)

// A TCP listener's loop (acceptTCP) serves only the connections admission
// control admits (ServerConfig.AdmitTCP) and the server has room for
// (ServerConfig.MaxTCPConns), issue 36 item 5. Without the bound, one pod
// could open connections until the node-wide process ran out of
// descriptors, each held for the request timeout; without admission, the
// DNS port would accept while every other listener sheds.
//
// Each connection is served on a goroutine of its own (serveTCPConn): a
// message at a time, each two-byte-length-prefixed (RFC 1035 §4.2.2),
// each answered before the next is read, until the peer closes, it is
// idle for the request timeout, or it has sent maxTCPQueries.

// defaultMaxTCPConns is MaxTCPConns when zero: a stub resolver opens a TCP
// connection only to retry a truncated answer, and each lasts at most one
// request timeout idle, so a pod that needs more than 64 at once is
// flooding.
const defaultMaxTCPConns = 64

// maxTCPQueries is how many messages a connection is served before it is
// closed, as miekg/dns's server, which gozt used before, closed them.
const maxTCPQueries = 128

// refusedLogEvery rate-limits the log line of refused connections.
const refusedLogEvery = time.Second

// The wait after a failed accept of a listener without AdmitTCP: doubled
// at each failure of a streak, from minAcceptRetry up to maxAcceptRetry,
// as net/http's server waits, so that running out of descriptors does not
// spin the loop.
const (
	minAcceptRetry = 5 * time.Millisecond
	maxAcceptRetry = time.Second
)

// acceptTCP is the loop of TCP listener l: it accepts connections and
// serves each on a goroutine of its own (serveTCPConn), until Shutdown.
// Its admission.Listener handles failed accepts; with
// ServerConfig.Sockets, once it reports that no connection came for an
// idle window (admission.ErrIdle), the loop parks the socket and ends; the
// wake starts it again.
func (s *Server) acceptTCP(l *listener) {
	for {
		c, err := l.accept.Accept()
		if err == nil {
			s.wg.Add(1)
			go s.serveTCPConn(l, c)
			continue
		}
		switch {
		case s.stopping():
		case errors.Is(err, admission.ErrIdle):
			if s.park(l) {
				return
			}
			continue
		default: // closed: admission.Listener returns no other error
			s.failed(l, err)
		}
		s.wg.Done() // over: Shutdown or a failure
		return
	}
}

// backOffHooks are the admission hooks of a TCP listener without
// AdmitTCP: a failed accept backs off, and every connection is admitted.
type backOffHooks struct{ s *Server }

func (h backOffHooks) Failed(err error, failures int) { h.s.backOff(err, failures) }
func (backOffHooks) Accepted()                        {}
func (backOffHooks) Admit(net.Conn) bool              { return true }

// backOff is the Failed of a listener without AdmitTCP: it waits before
// the next accept, less if Shutdown begins.
func (s *Server) backOff(err error, failures int) {
	retry := min(minAcceptRetry<<min(failures-1, 8), maxAcceptRetry)
	s.log.Warn("dns proxy: accept failed", "error", err, "retry_in", retry)
	s.sleep(retry)
}

// sleep waits for d, and reports whether it did: false if Shutdown began.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stop:
		return false
	}
}

// serveTCPConn serves connection c, accepted by l, until the peer closes
// it, it is idle for requestTimeout, it has sent maxTCPQueries messages,
// or Shutdown; then it closes c. A peer that is not answerable is not
// read at all. Each query is answered before the next message is read;
// messages shorter than a header and responses get no reply.
func (s *Server) serveTCPConn(l *listener, c net.Conn) {
	defer s.wg.Done()
	defer c.Close() // frees its slot (slotConn)
	if !answerable(l.self, addrPort(c.RemoteAddr())) || !s.track(c) {
		return
	}
	defer s.untrack(c)
	var buf []byte
	for range maxTCPQueries {
		m, err := s.readTCPMsg(c, buf)
		if err != nil {
			return // closed, idle, cut short or Shutdown: nothing to answer
		}
		buf = m
		if len(m) < headerLen || isResponse(m) {
			continue
		}
		req := new(dns.Msg)
		err = req.Unpack(m)
		out, err := packTCP(s.respond(req, err, "tcp"))
		if err == nil {
			err = c.SetWriteDeadline(time.Now().Add(requestTimeout))
		}
		if err == nil {
			_, err = c.Write(out)
		}
		if err != nil {
			s.log.Debug("dns reply failed", "src.addr", c.RemoteAddr(), "error", err)
			if !errors.Is(err, errPack) {
				return
			}
		}
	}
}

// errStopping ends the read of a connection once Shutdown has begun.
var errStopping = errors.New("dns: server shutting down")

// readTCPMsg reads the next message from c, into buf's array if it fits,
// within requestTimeout, the bound on each request and on the wait for it.
func (s *Server) readTCPMsg(c net.Conn, buf []byte) ([]byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(requestTimeout)); err != nil {
		return nil, err
	}
	// After the deadline (Shutdown): a read that started before Shutdown
	// has its deadline moved into the past.
	if s.stopping() {
		return nil, errStopping
	}
	buf = slices.Grow(buf[:0], 2)[:2]
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(buf))
	buf = slices.Grow(buf[:0], n)[:n]
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// errPack is a reply that cannot be sent: it does not pack, or is longer
// than the two-byte length of a TCP message allows. The connection goes
// on.
var errPack = errors.New("dns: reply cannot be packed")

// packTCP returns resp packed as a TCP message: prefixed by its length.
func packTCP(resp *dns.Msg) ([]byte, error) {
	b, err := resp.Pack()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPack, err)
	}
	if len(b) > dns.MaxMsgSize {
		return nil, fmt.Errorf("%w: %d bytes", errPack, len(b))
	}
	out := make([]byte, 2, 2+len(b))
	binary.BigEndian.PutUint16(out, uint16(len(b)))
	return append(out, b...), nil
}

// track adds c to the connections Shutdown interrupts, and reports
// whether it did: not once Shutdown has begun.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

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
// until its first Close, which serveTCPConn always makes.
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

// tcpListener returns l as its loop accepts from it: admitted (AdmitTCP,
// or every connection), idling after s.idle() if sockets are parked, then
// bounded.
func (s *Server) tcpListener(l *net.TCPListener) net.Listener {
	var a *admission.Listener
	if s.cfg.AdmitTCP != nil {
		a = s.cfg.AdmitTCP(l)
	} else {
		a = &admission.Listener{Listener: l, Hooks: backOffHooks{s}}
	}
	a.Idle = s.idle()
	return &boundedListener{Listener: a, slots: s.tcpSlots, refused: s.refuseTCP}
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
