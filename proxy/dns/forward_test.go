package dns

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// silentUpstream returns the address of a UDP socket that never answers.
func silentUpstream(t testing.TB, ip string) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// TestForwardTimeout: an upstream that never answers costs one timeout per
// attempt, then the next upstream answers; with no answering upstream the
// client gets SERVFAIL and the failure is counted.
func TestForwardTimeout(t *testing.T) {
	st := newTestStore(t)
	silent := silentUpstream(t, "127.83.1.1")
	up := startUpstream(t, "127.83.1.2")
	timeout := 200 * time.Millisecond
	both := startServer(t, "127.83.1.3", st, testClient, Config{
		Upstreams: []netip.AddrPort{silent, up.addr}, UpstreamTimeout: timeout, UpstreamAttempts: 1})
	resp := both.exchange(t, "tcp", question("outside.example.com", dns.TypeA))
	if diff := cmp.Diff([]string{forwarded, "outside.example.com. A 192.0.2.1"}, answerText(resp)); diff != "" {
		t.Errorf("after a silent upstream (-want +got):\n%s", diff)
	}

	only := startServer(t, "127.83.1.4", st, testClient, Config{
		Upstreams: []netip.AddrPort{silent}, UpstreamTimeout: timeout, UpstreamAttempts: 2})
	resp = only.exchange(t, "tcp", question("outside.example.com", dns.TypeA))
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Errorf("silent upstream only: %s with %d answers, want SERVFAIL", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
	m := only.srv.cfg.Resolver.cfg.Metrics
	if got := counterValue(t, m.upstreamFailures.WithLabelValues("a", "tcp", "client-app", "v7")); got != 1 {
		t.Errorf("istio_dns_upstream_failures_total = %v, want 1", got)
	}
	if !strings.Contains(only.logs.String(), "result=\"forwarding failed (") {
		t.Errorf("log lacks the forwarding failure:\n%s", only.logs.String())
	}

	none := startServer(t, "127.83.1.5", st, testClient, Config{})
	if resp := none.exchange(t, "udp", question("outside.example.com", dns.TypeA)); resp.Rcode != dns.RcodeServerFailure {
		t.Errorf("no upstream: %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
	}
}

// TestForwardTruncation: a truncated UDP answer from upstream is retried
// over TCP, and an answer too big for the client's UDP size is truncated
// towards it, so the client retries over TCP too.
func TestForwardTruncation(t *testing.T) {
	st := newTestStore(t)
	up := startUpstream(t, "127.83.1.6")
	ts := startServer(t, "127.83.1.7", st, testClient, Config{Upstreams: []netip.AddrPort{up.addr}})

	resp := ts.exchange(t, "tcp", question("big.example.com", dns.TypeA))
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 50 || resp.Truncated {
		t.Fatalf("big answer over TCP: %s, %d answers, TC=%v; want 50 answers", dns.RcodeToString[resp.Rcode], len(resp.Answer), resp.Truncated)
	}
	if u, tc := up.count("udp big.example.com."), up.count("tcp big.example.com."); u != 1 || tc != 1 {
		t.Errorf("upstream saw %d UDP and %d TCP queries, want 1 and 1 (the TCP retry)", u, tc)
	}

	resp = ts.exchange(t, "udp", question("big.example.com", dns.TypeA))
	if !resp.Truncated || len(resp.Answer) >= 50 {
		t.Errorf("big answer over UDP without EDNS: TC=%v with %d answers, want it truncated", resp.Truncated, len(resp.Answer))
	}
	req := question("big.example.com", dns.TypeA)
	req.SetEdns0(4096, false)
	resp = ts.exchange(t, "udp", req)
	if resp.Truncated || len(resp.Answer) != 50 {
		t.Errorf("big answer over UDP with EDNS 4096: TC=%v with %d answers, want all 50", resp.Truncated, len(resp.Answer))
	}
}

// TestInFlightLimit: with MaxInFlight queries waiting on a silent upstream,
// one more is answered SERVFAIL at once instead of queueing.
func TestInFlightLimit(t *testing.T) {
	st := newTestStore(t)
	pc, err := net.ListenPacket("udp", "127.83.1.8:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	received := make(chan struct{}, 8)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			received <- struct{}{}
		}
	}()
	silent := netip.MustParseAddrPort(pc.LocalAddr().String())
	srv := NewServer(ServerConfig{
		Resolver: NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry()),
			Upstreams: []netip.AddrPort{silent}, UpstreamTimeout: time.Minute, UpstreamAttempts: 1}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		MaxInFlight: 2,
	})
	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := srv.LookupIP(context.Background(), "outside.example.com", false)
			results <- err
		}()
	}
	<-received
	<-received // both queries are now waiting on the upstream
	resp := srv.resolve(context.Background(), question("svc1", dns.TypeA), "udp")
	if resp.Rcode != dns.RcodeServerFailure {
		t.Errorf("third query: %s, want SERVFAIL while two are in flight", dns.RcodeToString[resp.Rcode])
	}
	if err := srv.Shutdown(context.Background()); err != nil { // ends the two waits
		t.Fatal(err)
	}
	for range 2 {
		if err := <-results; err == nil {
			t.Error("a query waiting on a silent upstream succeeded")
		}
	}
	if resp := srv.resolve(context.Background(), question("svc1", dns.TypeA), "udp"); resp.Rcode != dns.RcodeSuccess {
		t.Errorf("after the in-flight queries ended: %s, want NOERROR", dns.RcodeToString[resp.Rcode])
	}
}
