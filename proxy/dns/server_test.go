package dns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// runServer binds srv and serves it until the test ends; it returns the
// first UDP and TCP addresses.
func runServer(t testing.TB, srv *Server) (udp, tcp string) {
	t.Helper()
	if err := srv.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	u, c := srv.Addrs()
	return u[0].String(), c[0].String()
}

// mustPack packs m, failing t if it does not pack.
func mustPack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResponsesDropped (issue 36 item 1): a message with QR=1, over UDP or
// TCP, gets no reply at all, as hickory (ztunnel's DNS server) drops
// responses to avoid reflection; queries sent after it are answered.
func TestResponsesDropped(t *testing.T) {
	st := newTestStore(t)
	ts := startServer(t, "127.83.4.1", st, testClient, Config{})
	resp := question("svc1", dns.TypeA)
	resp.Id = 1
	resp.Response = true
	query := question("svc1", dns.TypeA)
	query.Id = 2

	t.Run("udp", func(t *testing.T) {
		c := dialGuarded(t, "udp", ts.udp)
		for _, m := range []*dns.Msg{resp, query} {
			if _, err := c.Write(mustPack(t, m)); err != nil {
				t.Fatal(err)
			}
		}
		// Each datagram is served on a goroutine of its own: read until
		// the query's answer, then a little longer for a straggler.
		buf := make([]byte, 1500)
		for answered := false; ; {
			n, err := c.Read(buf)
			if answered && errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			got := new(dns.Msg)
			if err := got.Unpack(buf[:n]); err != nil {
				t.Fatalf("reply does not decode: %v", err)
			}
			if got.Id == resp.Id {
				t.Fatalf("a response was answered over UDP: %s", dns.RcodeToString[got.Rcode])
			}
			answered = true
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		}
	})
	t.Run("tcp", func(t *testing.T) {
		c, err := dns.Dial("tcp", ts.tcp)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
		for _, m := range []*dns.Msg{resp, query} {
			if err := c.WriteMsg(m); err != nil {
				t.Fatal(err)
			}
		}
		// One connection's messages are served in order: a reply to the
		// response would come first.
		got, err := c.ReadMsg()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if got.Id != query.Id || got.Rcode != dns.RcodeSuccess {
			t.Errorf("first reply over TCP: id %d %s, want the query's (id %d) NOERROR", got.Id, dns.RcodeToString[got.Rcode], query.Id)
		}
	})
}

// TestErrorRepliesInFlightBound (issue 36 item 1): FORMERR and NOTIMP
// replies count in MaxInFlight like any answer: with the bound taken by a
// query waiting on a silent upstream, a malformed message, whether the
// resolver refuses it (two questions, an opcode) or it does not decode,
// gets the SERVFAIL of a busy proxy, and its FORMERR or NOTIMP once the
// bound is free.
func TestErrorRepliesInFlightBound(t *testing.T) {
	st := newTestStore(t)
	silent, err := net.ListenPacket("udp", "127.83.4.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	received := make(chan struct{}, 8)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := silent.ReadFrom(buf); err != nil {
				return
			}
			received <- struct{}{}
		}
	}()
	srv := NewServer(ServerConfig{
		Resolver: NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry()),
			Upstreams:       []netip.AddrPort{netip.MustParseAddrPort(silent.LocalAddr().String())},
			UpstreamTimeout: time.Minute, UpstreamAttempts: 1}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		Addrs:       []netip.AddrPort{netip.MustParseAddrPort("127.83.4.3:0")},
		MaxInFlight: 1,
	})
	udp, _ := runServer(t, srv)

	twoQuestions := question("svc1", dns.TypeA)
	twoQuestions.Question = append(twoQuestions.Question, twoQuestions.Question[0])
	notify := question("svc1", dns.TypeA)
	notify.Opcode = dns.OpcodeNotify
	for _, m := range []*dns.Msg{twoQuestions, notify} {
		m.Id = 0x4242
	}
	malformed := []struct {
		name  string
		pkt   []byte
		rcode int // when not busy
	}{
		{"two questions", mustPack(t, twoQuestions), dns.RcodeFormatError},
		{"notify", mustPack(t, notify), dns.RcodeNotImplemented},
		{"truncated question", mustPack(t, twoQuestions)[:20], dns.RcodeFormatError},
	}
	send := func(t *testing.T, pkt []byte) *dns.Msg {
		t.Helper()
		resp := exchangeRaw(t, udp, pkt)
		if resp.Id != 0x4242 || !resp.Response {
			t.Fatalf("reply id %#x response=%v, want a response to id 0x4242", resp.Id, resp.Response)
		}
		return resp
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lookup := make(chan error, 1)
	go func() {
		_, err := srv.LookupIP(ctx, "outside.example.com", false)
		lookup <- err
	}()
	<-received // the lookup holds the only slot, waiting on the upstream
	for _, tc := range malformed {
		t.Run("busy/"+tc.name, func(t *testing.T) {
			if got := send(t, tc.pkt); got.Rcode != dns.RcodeServerFailure {
				t.Errorf("with the in-flight bound taken: %s, want SERVFAIL", dns.RcodeToString[got.Rcode])
			}
		})
	}
	cancel() // ends the lookup, freeing the slot
	if err := <-lookup; err == nil {
		t.Error("a lookup waiting on a silent upstream succeeded")
	}
	for _, tc := range malformed {
		t.Run("free/"+tc.name, func(t *testing.T) {
			if got := send(t, tc.pkt); got.Rcode != tc.rcode {
				t.Errorf("with the in-flight bound free: %s, want %s", dns.RcodeToString[got.Rcode], dns.RcodeToString[tc.rcode])
			}
		})
	}
}

// TestAnswerable: no reply goes to the listener's own address (any
// address with its port when it listens on the unspecified address), to
// port 0, the unspecified address or the IPv4 broadcast address.
func TestAnswerable(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		self, src string
		want      bool
	}{
		{"127.0.0.1:15053", "127.0.0.1:40000", true},
		{"127.0.0.1:15053", "127.0.0.2:15053", true},
		{"127.0.0.1:15053", "10.1.2.3:15053", true},
		{"127.0.0.1:15053", "127.0.0.1:15053", false},
		{"127.0.0.1:15053", "[::ffff:127.0.0.1]:15053", false},
		{"[::1]:15053", "[::1]:15053", false},
		{"[::1]:15053", "[::1]:53", true},
		{"0.0.0.0:15053", "10.1.2.3:15053", false},
		{"[::]:15053", "127.0.0.1:15053", false},
		{"0.0.0.0:15053", "10.1.2.3:15054", true},
		{"127.0.0.1:15053", "127.0.0.1:0", false},
		{"127.0.0.1:15053", "0.0.0.0:40000", false},
		{"127.0.0.1:15053", "[::]:40000", false},
		{"127.0.0.1:15053", "255.255.255.255:40000", false},
	} {
		if got := answerable(ap(tc.self), ap(tc.src)); got != tc.want {
			t.Errorf("answerable(%s, %s) = %v, want %v", tc.self, tc.src, got, tc.want)
		}
	}
	if answerable(ap("127.0.0.1:15053"), netip.AddrPort{}) {
		t.Error("answerable(127.0.0.1:15053, invalid) = true, want false")
	}
}

// TestTCPConnBound (issue 36 item 5): with MaxTCPConns connections open, one
// more is closed at once, unanswered, and counted in
// gozt_dns_tcp_connections_refused_total, while the open ones keep getting
// answers; once one closes a new one is served.
func TestTCPConnBound(t *testing.T) {
	const bound, extra = 3, 3
	st := newTestStore(t)
	m := NewMetrics(prometheus.NewRegistry())
	srv := NewServer(ServerConfig{
		Resolver: NewResolver(Config{Metrics: m}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		Addrs:       []netip.AddrPort{netip.MustParseAddrPort("127.83.4.4:0")},
		MaxTCPConns: bound,
	})
	_, tcp := runServer(t, srv)
	dial := func(t *testing.T) *dns.Conn {
		t.Helper()
		c, err := dns.Dial("tcp", tcp)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
		return c
	}
	ask := func(c *dns.Conn) error {
		if err := c.WriteMsg(question("svc1", dns.TypeA)); err != nil {
			return err
		}
		resp, err := c.ReadMsg()
		if err == nil && resp.Rcode != dns.RcodeSuccess {
			err = errors.New(dns.RcodeToString[resp.Rcode])
		}
		return err
	}
	var open []*dns.Conn
	for i := range bound {
		c := dial(t)
		if err := ask(c); err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, bound, err)
		}
		open = append(open, c)
	}
	for i := range extra {
		start := time.Now()
		// The reset may come before the dial returns.
		c, err := dns.Dial("tcp", tcp)
		if err == nil {
			c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
			err = ask(c)
			c.Close()
		}
		if err == nil {
			t.Fatalf("connection %d past the bound of %d was answered", i+1, bound)
		}
		// Closed at once, not after the 5 s request timeout.
		if d := time.Since(start); d > requestTimeout/2 {
			t.Errorf("connection %d past the bound ended after %v (%v), want at once", i+1, d, err)
		}
	}
	for i, c := range open {
		if err := ask(c); err != nil {
			t.Errorf("open connection %d after the refusals: %v", i+1, err)
		}
	}
	if got := counterValue(t, m.tcpRefused); got != extra {
		t.Errorf("gozt_dns_tcp_connections_refused_total = %v, want %d", got, extra)
	}
	open[0].Close()
	// The server frees the slot when it reads the close: retry until it has.
	for start := time.Now(); !served(tcp, ask); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("no new connection served 5s after an open one closed")
		}
	}
}

// served reports whether a new connection to addr was answered by ask.
func served(addr string, ask func(*dns.Conn) error) bool {
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	return ask(c) == nil
}

// exchangeRaw sends pkt, raw bytes, to the UDP address udp and returns the
// reply, failing t if none comes within 10 s (a hang guard, not a timing
// assertion) or it does not decode.
func exchangeRaw(t *testing.T, udp string, pkt []byte) *dns.Msg {
	t.Helper()
	resp := new(dns.Msg)
	if err := resp.Unpack(rawExchange(t, udp, pkt)); err != nil {
		t.Fatalf("reply does not decode: %v", err)
	}
	return resp
}
