package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/internal/dnstest"
	"github.com/gozt/gozt/proxy/sockwait"
	"github.com/gozt/gozt/state"
)

// newLoopServer returns a server of the fixture mesh for testClient on
// ip, forwarding to upstreams, not yet listening; edit, if non-nil,
// changes its config first.
func newLoopServer(t testing.TB, ip string, edit func(*ServerConfig), upstreams ...netip.AddrPort) *Server {
	t.Helper()
	st := newTestStore(t)
	cfg := ServerConfig{
		Resolver: NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry()),
			Upstreams: upstreams, UpstreamTimeout: time.Minute, UpstreamAttempts: 1}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		Addrs:       []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr(ip), 0)},
		MaxInFlight: 1024,
	}
	if edit != nil {
		edit(&cfg)
	}
	return NewServer(cfg)
}

// writeTCPRaw writes pkt to c as one TCP message, length-prefixed.
func writeTCPRaw(t testing.TB, c net.Conn, pkt []byte) {
	t.Helper()
	out := binary.BigEndian.AppendUint16(nil, uint16(len(pkt)))
	if _, err := c.Write(append(out, pkt...)); err != nil {
		t.Fatal(err)
	}
}

// readTCPReply reads one length-prefixed message from c.
func readTCPReply(c net.Conn) (*dns.Msg, error) {
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	return m, m.Unpack(b)
}

// withID returns m packed with id.
func withID(t testing.TB, m *dns.Msg, id uint16) []byte {
	t.Helper()
	m.Id = id
	return mustPack(t, m)
}

// TestTCPQueriesInOrder: one TCP connection carries many messages, each
// answered in turn, in order; a message shorter than a header and a
// response get no reply and the connection goes on; one that does not
// decode gets FORMERR.
func TestTCPQueriesInOrder(t *testing.T) {
	_, tcp := runServer(t, newLoopServer(t, "127.83.5.1", nil))
	c := dialGuarded(t, "tcp", tcp)
	response := question("svc1", dns.TypeA)
	response.Response = true
	sent := [][]byte{
		withID(t, question("svc1", dns.TypeA), 1),
		{0, 9, 1, 0, 0},
		withID(t, response, 2),
		withID(t, question("svc1.ns1.svc.cluster.local", dns.TypeA), 3)[:20],
		{},
		withID(t, question("svc2.ns2", dns.TypeA), 4),
		withID(t, question("se.example.com", dns.TypeA), 5),
	}
	for _, pkt := range sent {
		writeTCPRaw(t, c, pkt)
	}
	want := []struct {
		id    uint16
		rcode int
	}{{1, dns.RcodeSuccess}, {3, dns.RcodeFormatError}, {4, dns.RcodeSuccess}, {5, dns.RcodeSuccess}}
	for _, w := range want {
		got, err := readTCPReply(c)
		if err != nil {
			t.Fatalf("reply to id %d: %v", w.id, err)
		}
		if got.Id != w.id || got.Rcode != w.rcode {
			t.Errorf("reply id %d %s, want id %d %s", got.Id, dns.RcodeToString[got.Rcode], w.id, dns.RcodeToString[w.rcode])
		}
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if got, err := readTCPReply(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("after the last reply: %v, %v; want nothing more", got, err)
	}
}

// TestShortDatagramDropped: a datagram shorter than a header (no id to
// answer to) gets no reply; the query after it is answered.
func TestShortDatagramDropped(t *testing.T) {
	udp, _ := runServer(t, newLoopServer(t, "127.83.5.2", nil))
	c := dialGuarded(t, "udp", udp)
	for _, pkt := range [][]byte{{}, {0x42}, withID(t, question("svc1", dns.TypeA), 7)[:headerLen-1], withID(t, question("svc1", dns.TypeA), 8)} {
		if _, err := c.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got := new(dns.Msg)
	if err := got.Unpack(buf[:n]); err != nil || got.Id != 8 {
		t.Fatalf("first reply: id %d (%v), want the query's, id 8", got.Id, err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a datagram shorter than a header was answered: %x", buf[:n])
	}
}

// TestUDPQueriesKeepTheirBytes: many queries at once, from several
// sockets, each get the answer to their own question: a read buffer is
// not reused while the query in it is being decoded (run with -race).
func TestUDPQueriesKeepTheirBytes(t *testing.T) {
	udp, _ := runServer(t, newLoopServer(t, "127.83.5.3", nil))
	names := []struct{ name, addr string }{
		{"svc1", "10.0.0.1"}, {"svc2.ns2", "10.0.0.2"}, {"se.example.com", "10.0.0.7"},
		{"v4only", "10.0.0.6"}, {"db-0.db", "10.0.0.8"}, {"www.wild.example.com", "10.0.0.4"},
	}
	// Each client keeps a window of queries outstanding, few enough that
	// no socket buffer overflows.
	const clients, windows, window = 8, 5, 10
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for ci := range clients {
		wg.Go(func() {
			errs <- func() error {
				c, err := net.Dial("udp", udp)
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
				for w := range windows {
					for i := w * window; i < (w+1)*window; i++ {
						q := question(names[(ci+i)%len(names)].name, dns.TypeA)
						if _, err := c.Write(withID(t, q, uint16(i))); err != nil {
							return err
						}
					}
					if err := readAnswers(c, window, func(id uint16) (string, string) {
						n := names[(ci+int(id))%len(names)]
						return n.name, n.addr
					}); err != nil {
						return err
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// readAnswers reads n replies from c, each of which must answer the
// question want returns for its id with the address want returns.
func readAnswers(c net.Conn, n int, want func(id uint16) (name, addr string)) error {
	buf := make([]byte, 1500)
	for range n {
		k, err := c.Read(buf)
		if err != nil {
			return err
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:k]); err != nil {
			return err
		}
		name, addr := want(m.Id)
		if len(m.Answer) == 0 || len(m.Question) != 1 || m.Question[0].Name != dns.Fqdn(name) {
			return fmt.Errorf("id %d: %v, want the answer for %s", m.Id, m, name)
		}
		if a, ok := m.Answer[len(m.Answer)-1].(*dns.A); !ok || a.A.String() != addr {
			return fmt.Errorf("id %d: %v, want %s A %s", m.Id, m.Answer, name, addr)
		}
	}
	return nil
}

// TestLargeUDPQuery: a query longer than 512 bytes (here its EDNS
// padding, RFC 7830) is read whole and answered; up to udpBufSize.
func TestLargeUDPQuery(t *testing.T) {
	udp, _ := runServer(t, newLoopServer(t, "127.83.5.4", nil))
	q := question("svc1", dns.TypeA)
	q.SetEdns0(1232, false)
	opt := q.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_PADDING{Padding: make([]byte, 1500)})
	q.Id = 0x4343
	resp := exchangeRaw(t, udp, mustPack(t, q))
	if resp.Id != 0x4343 || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Errorf("reply to a %d-byte query: id %#x %s, %d answers; want NOERROR with the answer", len(mustPack(t, q)), resp.Id, dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
}

// TestFormErrAsMiekg: the FORMERR of a query that does not decode is,
// byte for byte, the one miekg/dns's server answered when it served the
// sockets (formErr), over UDP through the server's own loop too.
func TestFormErrAsMiekg(t *testing.T) {
	// The reference: miekg/dns's server, handing every query on, as the
	// proxy configured it.
	pc, err := net.ListenPacket("udp", "127.83.5.5:0")
	if err != nil {
		t.Fatal(err)
	}
	dnstest.Serve(t, &dns.Server{PacketConn: pc,
		MsgAcceptFunc: func(h dns.Header) dns.MsgAcceptAction {
			if h.Bits&qrBit != 0 {
				return dns.MsgIgnore
			}
			return dns.MsgAccept
		},
		Handler: dns.HandlerFunc(func(dns.ResponseWriter, *dns.Msg) { t.Error("the handler got an undecodable query") })})
	udp, _ := runServer(t, newLoopServer(t, "127.83.5.6", nil))

	q := question("svc1.ns1.svc.cluster.local", dns.TypeA)
	q.Id = 0x4242
	q.RecursionDesired, q.CheckingDisabled, q.AuthenticatedData, q.Truncated = true, true, true, true
	q.SetEdns0(1232, true)
	full := mustPack(t, q)
	two := q.Copy()
	two.Question = append(two.Question, two.Question[0])
	notify := q.Copy()
	notify.Opcode = dns.OpcodeNotify
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{
		{"truncated question", full[:20]},
		{"truncated OPT", full[:len(full)-3]},
		{"second question cut", mustPack(t, two)[:len(mustPack(t, two))-20]},
		{"notify cut", mustPack(t, notify)[:20]},
		{"label past the end", append(append([]byte(nil), full[:12]...), 63, 'a')},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := new(dns.Msg)
			if err := req.Unpack(tc.pkt); err == nil {
				t.Fatal("the test message decodes")
			}
			want := rawExchange(t, pc.LocalAddr().String(), tc.pkt)
			got, err := formErr(req).Pack()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("formErr packs to\n%x\nmiekg/dns's server answered\n%x", got, want)
			}
			if got := rawExchange(t, udp, tc.pkt); string(got) != string(want) {
				t.Errorf("the server answered\n%x\nmiekg/dns's server answered\n%x", got, want)
			}
		})
	}
}

// dialGuarded dials addr over network. The connection has a 10 s deadline
// (a hang guard, not a timing assertion) and is closed when the test ends.
func dialGuarded(t *testing.T, network, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// rawExchange sends pkt to the UDP address addr and returns the raw
// reply, failing t if none comes within 10 s (a hang guard).
func rawExchange(t *testing.T, addr string, pkt []byte) []byte {
	t.Helper()
	c := dialGuarded(t, "udp", addr)
	defer c.Close() // now, not at the test's end: callers exchange many times
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	return buf[:n]
}

// gatedUpstream is an upstream, UDP and TCP, that answers every A
// question 192.0.2.1 once open is called; each question it is asked is
// signalled on asked first.
type gatedUpstream struct {
	addr    netip.AddrPort
	asked   chan struct{}
	release chan struct{}
	once    sync.Once
}

// open lets the upstream answer.
func (u *gatedUpstream) open() { u.once.Do(func() { close(u.release) }) }

func startGatedUpstream(t *testing.T, ip string) *gatedUpstream {
	t.Helper()
	u := &gatedUpstream{asked: make(chan struct{}, 16), release: make(chan struct{})}
	pc, l := listenPair(t, ip)
	u.addr = netip.MustParseAddrPort(pc.LocalAddr().String())
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		u.asked <- struct{}{}
		<-u.release
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeA,
			Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
		w.WriteMsg(resp)
	})
	dnstest.Serve(t, &dns.Server{PacketConn: pc, Handler: h})
	dnstest.Serve(t, &dns.Server{Listener: l, Handler: h})
	t.Cleanup(u.open) // before the servers' Shutdown: cleanups run last first
	return u
}

// TestShutdownAnswersInFlight: Shutdown stops reading and accepting at
// once, closes an idle TCP connection at once, and waits for the queries
// in flight, over UDP and TCP, which get their answers; also once the
// sockets they came from are parked.
func TestShutdownAnswersInFlight(t *testing.T) {
	t.Run("unparked", func(t *testing.T) { testShutdownAnswersInFlight(t, "127.83.5.7", nil) })
	t.Run("parked", func(t *testing.T) { testShutdownAnswersInFlight(t, "127.83.5.11", newSet(t)) })
}

// testShutdownAnswersInFlight is TestShutdownAnswersInFlight for a server
// on ip (and its upstream on the address after) parking its sockets in
// set, if non-nil.
func testShutdownAnswersInFlight(t *testing.T, ip string, set *sockwait.Set) {
	next := netip.MustParseAddr(ip).Next().String()
	up := startGatedUpstream(t, next)
	srv := newLoopServer(t, ip, parking(set, 20*time.Millisecond), up.addr)
	if err := srv.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	udps, tcps := srv.Addrs()
	udp, tcp := udps[0].String(), tcps[0].String()

	idle, err := net.Dial("tcp", tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	q := question("outside.example.com", dns.TypeA)
	answers := make(chan error, 2)
	for _, network := range []string{"udp", "tcp"} {
		go func() {
			c := &dns.Client{Net: network, Timeout: 10 * time.Second}
			addr := map[string]string{"udp": udp, "tcp": tcp}[network]
			resp, _, err := c.Exchange(q.Copy(), addr)
			if err == nil && (resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1) {
				err = fmt.Errorf("%s: %s, %d answers", network, dns.RcodeToString[resp.Rcode], len(resp.Answer))
			}
			answers <- err
		}()
	}
	<-up.asked
	<-up.asked // both queries wait on the upstream
	if set != nil {
		waitFor(t, "both sockets parked", func() bool { return set.Parked() == 2 })
	}
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("an idle TCP connection at Shutdown: read %v, want EOF", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with queries in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := net.DialTimeout("tcp", tcp, time.Second); err == nil {
		t.Error("a connection was accepted after Shutdown began")
	}
	up.open()
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("a query in flight at Shutdown: %v", err)
		}
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestShutdownAbandonsAtDeadline: a query whose upstream never answers
// holds Shutdown only until its ctx is done.
func TestShutdownAbandonsAtDeadline(t *testing.T) {
	up := startGatedUpstream(t, "127.83.5.9")
	srv := newLoopServer(t, "127.83.5.10", nil, up.addr)
	if err := srv.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	udps, _ := srv.Addrs()
	c, err := net.Dial("udp", udps[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(withID(t, question("outside.example.com", dns.TypeA), 9)); err != nil {
		t.Fatal(err)
	}
	<-up.asked
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Shutdown with a query on a silent upstream took %v, want about its ctx's 100ms", d)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
