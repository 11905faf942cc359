package dns

import (
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// What a listener answers: each loop screens what it reads before a query
// is decoded (issue 36 item 1), so that every reply is made inside the
// in-flight bound, and none goes where it would start a loop.

// qrBit is the QR bit of a header's flags (RFC 1035 §4.1.1): set in a
// response, clear in a query.
const qrBit = 1 << 15

// isResponse reports whether the message m, at least a header long, is a
// response (QR=1). A loop drops every response without a reply, and hands
// every query on, which is answered FORMERR or NOTIMP, as ztunnel does,
// if it is not one the resolver answers (precheck, malformed).
//
// A reply to a response is itself a response: answering one lets a single
// datagram spoofed from the proxy's own address (or from another proxy's)
// bounce for ever, tens of thousands of times a second (issue 36). Hickory,
// ztunnel's DNS server, returns before handling any response "to avoid DoS
// attacks from reflection" (crates/server/src/server/server_future.rs,
// handle_request); miekg/dns's server, which gozt used before, does the
// same by default.
func isResponse(m []byte) bool { return m[2]&(qrBit>>8) != 0 }

// respond returns the reply to a query, a message at least a header long
// that is not a response, received over network: req is what
// dns.Msg.Unpack made of it, with err. Every reply is made inside the
// in-flight bound.
func (s *Server) respond(req *dns.Msg, err error, network string) *dns.Msg {
	if err != nil {
		return s.malformed(req)
	}
	return s.resolve(s.lifetime, req, network)
}

// malformed answers a query whose header decodes but whose body does not,
// req being what dns.Msg.Unpack made of it: FORMERR (formErr), or, while
// the in-flight bound is full, the SERVFAIL of a busy proxy to its header
// alone, as the resolver answers any query then.
func (s *Server) malformed(req *dns.Msg) *dns.Msg {
	if !s.enter() {
		return errorReply(&dns.Msg{MsgHdr: req.MsgHdr}, dns.RcodeServerFailure)
	}
	defer s.leave()
	return formErr(req)
}

// formErr is the FORMERR reply to a query that does not decode, req being
// what dns.Msg.Unpack made of it before it failed: the query's header and
// the questions that decoded, as a response with opcode QUERY, not
// authoritative, and no other record. It is the reply miekg/dns's server
// made, which gozt served its sockets with before (issue 40), byte for
// byte.
func formErr(req *dns.Msg) *dns.Msg {
	resp := &dns.Msg{MsgHdr: req.MsgHdr, Question: req.Question}
	resp.Response, resp.Opcode, resp.Rcode = true, dns.OpcodeQuery, dns.RcodeFormatError
	resp.Authoritative, resp.Zero = false, false
	return resp
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
