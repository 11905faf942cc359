package dns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
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

// FuzzDecodable: whatever a client sends, decodable returns it unchanged
// or, for a query that does not decode, its header alone, which decodes
// with the same id, flags and opcode and no records; and a message that
// decodes is always returned unchanged.
func FuzzDecodable(f *testing.F) {
	q, err := question("svc1", dns.TypeA).Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(q)
	f.Add(q[:20])
	f.Add(q[:11])
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := append([]byte(nil), b...)
		got := decodable(b)
		if new(dns.Msg).Unpack(orig) == nil || len(orig) < headerLen || orig[2]&0x80 != 0 {
			if string(got) != string(orig) {
				t.Fatalf("decodable changed a message it must pass on:\n%x\n%x", orig, got)
			}
			return
		}
		m := new(dns.Msg)
		if err := m.Unpack(got); err != nil {
			t.Fatalf("decodable(%x) = %x, which does not decode: %v", orig, got, err)
		}
		if string(got[:4]) != string(orig[:4]) || len(got) != headerLen {
			t.Fatalf("decodable(%x) = %x, want the header with counts zero", orig, got)
		}
	})
}
