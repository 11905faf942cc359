package dns

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"
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
		c, err := net.Dial("udp", ts.udp)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard, not a timing assertion
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
