package dns

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// udpBufSize is the largest query a UDP socket reads whole: 4096 bytes,
// as hickory (ztunnel's DNS server) reads, the payload RFC 6891 §6.2.5
// suggests; the rest of a longer datagram is lost and its query, cut
// short, most likely answered FORMERR.
const udpBufSize = 4096

// udpBuf is the buffer a UDP socket reads one datagram into.
type udpBuf [udpBufSize]byte

// udpBufs are the read buffers of every UDP socket of the process. A
// read holds one, and the query read into it until it is decoded: a
// buffer per socket and per query being decoded, not one per query
// waiting on an upstream. Package-level, against the rule, because the
// buffers are for the whole process to share: one node-wide gozt has a
// Server per pod.
var udpBufs = sync.Pool{New: func() any { return new(udpBuf) }}

// readUDP is the loop of UDP socket l: it reads datagrams and answers
// each query on a goroutine of its own (answerUDP), until Shutdown. It
// drops what no reply may go to: datagrams from a source that is not
// answerable, shorter than a header, or responses (screen.go).
//
// With ServerConfig.Sockets, once no datagram came for an idle window it
// parks the socket and ends; the wake starts it again. The read deadline
// is set once per window, not per datagram: a window in which datagrams
// came is followed by another, so a socket parks after one to two Idle.
func (s *Server) readUDP(l *listener) {
	idle := s.idle()
	b := udpBufs.Get().(*udpBuf)
	armed, reads := false, 0 // the window's deadline is set; datagrams in it
	for {
		if idle > 0 && !armed {
			_ = l.udp.SetReadDeadline(time.Now().Add(idle))
			armed, reads = true, 0
			l.deadlines++
			if s.stopping() { // after the deadline: see Shutdown
				break
			}
		}
		n, src, err := l.udp.ReadFromUDPAddrPort(b[:])
		if err != nil {
			if s.stopping() {
				break
			}
			if !armed || !errors.Is(err, os.ErrDeadlineExceeded) {
				s.failed(l, err)
				break
			}
			armed = false
			if reads > 0 {
				continue
			}
			udpBufs.Put(b)
			if s.park(l) {
				return
			}
			b = udpBufs.Get().(*udpBuf)
			continue
		}
		reads++
		m := b[:n]
		if !answerable(l.self, src) || len(m) < headerLen || isResponse(m) {
			continue
		}
		s.wg.Add(1)
		go s.answerUDP(l, b, n, src)
		b = udpBufs.Get().(*udpBuf)
	}
	udpBufs.Put(b)
	s.wg.Done()
}

// answerUDP answers the query in b[:n], from src, to src, then frees b as
// soon as it is decoded: the answer may wait on an upstream. The reply is
// truncated to what src accepts.
func (s *Server) answerUDP(l *listener, b *udpBuf, n int, src netip.AddrPort) {
	defer s.wg.Done()
	req := new(dns.Msg)
	err := req.Unpack(b[:n])
	udpBufs.Put(b) // what req holds is copied out of b
	resp := s.respond(req, err, "udp")
	resp.Truncate(udpSize(req))
	out, err := resp.Pack()
	if err == nil {
		_, err = l.udp.WriteToUDPAddrPort(out, src)
	}
	if err != nil {
		s.log.Debug("dns reply failed", "src.addr", src, "error", err)
	}
}

// udpSize is the largest UDP response req's sender accepts (RFC 6891 §6.2.5).
func udpSize(req *dns.Msg) int {
	if opt := req.IsEdns0(); opt != nil {
		return max(int(opt.UDPSize()), dns.MinMsgSize)
	}
	return dns.MinMsgSize
}
