package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// FuzzAnswer feeds the request path any message a client can send. Every
// message that decodes gets a response that is a response to it (same id
// and question, QR set), packs, and has a response code the proxy uses;
// local answers carry only the records of the question's type and CNAMEs.
func FuzzAnswer(f *testing.F) {
	for _, m := range []*dns.Msg{
		question("svc1", dns.TypeA),
		question("svc2.ns2.ns1.svc.cluster.local", dns.TypeA),
		question("www.wild.example.com", dns.TypeAAAA),
		question("headless.ns1.svc.cluster.local", dns.TypeA),
		question("outside.example.com", dns.TypeMX),
		func() *dns.Msg { m := question("svc1.ns1", dns.TypeAAAA); m.SetEdns0(1232, true); return m }(),
		func() *dns.Msg { m := question("svc1", dns.TypeA); m.Opcode = dns.OpcodeUpdate; return m }(),
		func() *dns.Msg { m := question("svc1", dns.TypeA); m.Response = true; return m }(),
	} {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	st := newTestStore(f)
	r := NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry()),
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.83.2.1:53")}})
	noDial := func(context.Context, string, netip.AddrPort) (net.Conn, error) {
		return nil, errors.New("no network in the fuzz target")
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(b); err != nil {
			return
		}
		resp := r.answer(context.Background(), query{snap: st.Snapshot(), client: testClient, req: req, proto: "udp", dial: noDial})
		if resp.Id != req.Id || !resp.Response {
			t.Fatalf("response id %d response=%v to request id %d", resp.Id, resp.Response, req.Id)
		}
		if len(req.Question) > 0 && (len(resp.Question) != 1 || resp.Question[0] != req.Question[0]) {
			t.Fatalf("response question %v to %v", resp.Question, req.Question)
		}
		switch resp.Rcode {
		case dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeNotImplemented, dns.RcodeServerFailure:
		default:
			t.Fatalf("rcode %s", dns.RcodeToString[resp.Rcode])
		}
		if _, err := resp.Pack(); err != nil {
			t.Fatalf("response does not pack: %v\n%v", err, resp)
		}
		for _, rr := range resp.Answer {
			if typ := rr.Header().Rrtype; typ != dns.TypeCNAME && typ != req.Question[0].Qtype {
				t.Fatalf("answer %v to a %s question", rr, dns.Type(req.Question[0].Qtype))
			}
		}
	})
}

// FuzzRespond feeds a server's reply path (respond) any query a client can
// send, as a loop hands it on: at least a header long, QR clear. Every
// one gets a response with its id that packs and has a response code the
// proxy uses; one that does not decode, FORMERR; and while the in-flight
// bound is full, every one the SERVFAIL of a busy proxy.
func FuzzRespond(f *testing.F) {
	q := question("svc1", dns.TypeA)
	q.Id = 0x4242
	b, err := q.Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, false)
	f.Add(b[:20], false)
	f.Add(b[:20], true)
	f.Add(b[:12], false)
	f.Add(b, true)
	st := newTestStore(f)
	srv := NewServer(ServerConfig{
		Resolver: NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry())}), // no upstream: no network
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		MaxInFlight: 1,
	})
	defer srv.Shutdown(context.Background())
	f.Fuzz(func(t *testing.T, b []byte, busy bool) {
		if len(b) < headerLen || isResponse(b) {
			return // the loops drop these
		}
		if busy {
			srv.inFlight <- struct{}{}
			defer func() { <-srv.inFlight }()
		}
		req := new(dns.Msg)
		decodeErr := req.Unpack(b)
		resp := srv.respond(req, decodeErr, "udp")
		if id := binary.BigEndian.Uint16(b); resp.Id != id || !resp.Response {
			t.Fatalf("response id %#x response=%v to a query with id %#x", resp.Id, resp.Response, id)
		}
		if _, err := resp.Pack(); err != nil {
			t.Fatalf("response does not pack: %v\n%v", err, resp)
		}
		want := map[int]bool{dns.RcodeSuccess: true, dns.RcodeFormatError: true, dns.RcodeNotImplemented: true, dns.RcodeServerFailure: true}
		switch {
		case busy:
			want = map[int]bool{dns.RcodeServerFailure: true}
		case decodeErr != nil:
			want = map[int]bool{dns.RcodeFormatError: true}
		}
		if !want[resp.Rcode] {
			t.Fatalf("rcode %s (busy %v, decode error %v)", dns.RcodeToString[resp.Rcode], busy, decodeErr)
		}
	})
}
