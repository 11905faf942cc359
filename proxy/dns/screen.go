package dns

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// What a listener answers: each listener screens what it reads before
// miekg/dns serves it (issue 36 item 1), so that every reply is the
// handler's, inside the in-flight bound, and none goes where it would
// start a loop.

// qrBit is the QR bit of a header's flags (RFC 1035 §4.1.1): set in a
// response, clear in a query.
const qrBit = 1 << 15

// acceptQueries drops every response (QR=1) without a reply and hands
// every query to the handler, which answers FORMERR or NOTIMP itself as
// ztunnel does (Resolver.precheck).
//
// A reply to a response is itself a response: answering one lets a single
// datagram spoofed from the proxy's own address (or from another proxy's)
// bounce for ever, tens of thousands of times a second (issue 36). Hickory,
// ztunnel's DNS server, returns before handling any response "to avoid DoS
// attacks from reflection" (crates/server/src/server/server_future.rs,
// handle_request); miekg/dns's own default does the same.
func acceptQueries(h dns.Header) dns.MsgAcceptAction {
	if h.Bits&qrBit != 0 {
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// screen is the Reader of one listener: it reads as miekg/dns's own does,
// drops the messages no reply may go to (answerable) before the server
// starts serving them, and, while the in-flight bound is full, hands an
// undecodable query on as its header alone (decodable).
type screen struct {
	dns.Reader
	self netip.AddrPort // the listener's address
	// busy reports whether the server's in-flight bound is full.
	busy func() bool
}

// bounded returns m as the server should serve it: unchanged while the
// in-flight bound has room, else decodable(m). miekg/dns answers a query
// it cannot decode FORMERR itself, outside the handler and its bound; with
// room in the bound that reply is the one the handler would give, at no
// more cost than the handler's busy SERVFAIL, so only a full bound needs
// the header-only form, which the handler answers SERVFAIL as busy. Every
// query is then decoded once (by miekg/dns) unless the bound is full:
// decodable's trial decode costs about as much as miekg/dns's own.
func (sc screen) bounded(m []byte) []byte {
	if sc.busy == nil || !sc.busy() {
		return m
	}
	return decodable(m)
}

// errUnanswerable ends a TCP connection whose peer no reply may go to.
var errUnanswerable = errors.New("dns: source cannot be answered")

func (sc screen) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, s, err := sc.Reader.ReadUDP(conn, timeout)
		if err != nil || s == nil || answerable(sc.self, addrPort(s.RemoteAddr())) {
			return sc.bounded(m), s, err
		}
	}
}

func (sc screen) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	if !answerable(sc.self, addrPort(conn.RemoteAddr())) {
		return nil, errUnanswerable // miekg/dns closes conn
	}
	m, err := sc.Reader.ReadTCP(conn, timeout)
	return sc.bounded(m), err
}

// decodable returns m, or, if m is a query whose header decodes but whose
// body does not, its header alone with every section count zero. miekg/dns
// answers a message it cannot decode FORMERR itself, outside the handler
// and so outside the in-flight bound; the header alone decodes, and the
// handler answers it inside the bound (issue 36 item 1): SERVFAIL while
// the bound is full (the only time screen asks), else FORMERR (no
// question) or NOTIMP (an opcode other than QUERY). A message shorter than a
// header gets no reply from miekg/dns, and a response none from
// acceptQueries, so neither is decoded here.
func decodable(m []byte) []byte {
	if len(m) < headerLen || m[2]&(qrBit>>8) != 0 || new(dns.Msg).Unpack(m) == nil {
		return m
	}
	h := m[:headerLen] // same array: miekg/dns pools UDP buffers by capacity
	clear(h[4:])       // QDCOUNT, ANCOUNT, NSCOUNT, ARCOUNT (RFC 1035 §4.1.1)
	return h
}

// headerLen is the length of a DNS header (RFC 1035 §4.1.1).
const headerLen = 12

// answerable reports whether a reply from the listener at self may go to
// src. Not to the listener itself: a datagram spoofed from the proxy's own
// address would have the proxy read its own reply (issue 36); a listener
// on the unspecified address does not know all of its addresses, so no
// source with its port is answered (a stub resolver never sends from the
// proxy's port). Nor to port 0 or the unspecified address, where no reply
// can arrive, nor to the IPv4 broadcast address, the sources hickory's
// sanitize_src_address refuses (server_future.rs).
func answerable(self, src netip.AddrPort) bool {
	switch {
	case !src.IsValid() || src.Port() == 0 || src.Addr().IsUnspecified() || src.Addr().Unmap() == broadcast:
		return false
	case src.Port() != self.Port():
		return true
	}
	return !self.Addr().IsUnspecified() && src.Addr().Unmap() != self.Addr().Unmap()
}

// broadcast is the IPv4 limited broadcast address (RFC 919).
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// addrPort returns a UDP or TCP address as an AddrPort, or the zero
// AddrPort for any other.
func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort()
	case *net.TCPAddr:
		return a.AddrPort()
	}
	return netip.AddrPort{}
}
