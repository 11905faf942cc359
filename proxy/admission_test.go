package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/syncbuf"
	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/proxy/telemetry"
)

// The admission test's workload, on 127.92.1.0/24.
const (
	admitWorkloadIP = "127.92.1.2"
	admitEchoIP     = "127.92.1.9"
)

// shedCount reads gozt_connections_shed_total{listener, reason}.
func shedCount(t *testing.T, m *telemetry.Metrics, listener, reason string) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Shed(listener, reason).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

// TestAdmissionShedsUnderMemoryPressure (TESTPLAN F22, in process): above
// the high-water mark a new SOCKS5 connection is reset before its
// handshake and a new CONNECT on an HBONE connection already open is
// answered 503, each counted in gozt_connections_shed_total and logged
// once; connections already open keep flowing; below the low-water mark
// new connections and streams succeed again.
func TestAdmissionShedsUnderMemoryPressure(t *testing.T) {
	echo, local, ca, id, store := oneWorkload(t, admitEchoIP, admitWorkloadIP)
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	var used atomic.Uint64
	adm := admission.New(admission.Config{MemoryLimit: 1000, Interval: 5 * time.Millisecond, Logger: log, ReadMemory: used.Load})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- adm.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	m := telemetry.NewMetrics(prometheus.NewRegistry())
	serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/w", BindAddr: netip.MustParseAddr(admitWorkloadIP), EnableSOCKS5: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: m, Admission: adm, Logger: log,
	}, 100*time.Millisecond)

	socks, err := xproxy.SOCKS5("tcp", admitWorkloadIP+":15080", nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	flowing, err := socks.Dial("tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer flowing.Close()
	fr := bufio.NewReader(flowing)
	echoOnce(t, flowing, fr, "before")
	cert, err := ca.Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	cc := dialHBONE(t, cctx, "", admitWorkloadIP+":15008", cert, id.String())
	sibling, err := cc.Connect(cctx, local, nil)
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	defer sibling.Close()
	sr := bufio.NewReader(sibling)
	echoOnce(t, sibling, sr, "sibling before")

	setMemory := func(v uint64, want bool) { t.Helper(); setMemoryUsed(t, adm, &used, v, want) }
	setMemory(900, true)
	for i := range 3 {
		if c, err := socks.Dial("tcp", echo); err == nil {
			c.Close()
			t.Fatalf("SOCKS5 connection %d under memory pressure succeeded", i)
		} else if i == 0 {
			t.Logf("SOCKS5 connection under memory pressure: %v", err)
		}
	}
	var se *hbone.StatusError
	if s, err := cc.Connect(cctx, local, nil); err == nil {
		s.Close()
		t.Fatal("CONNECT under memory pressure succeeded")
	} else if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
		t.Errorf("CONNECT under memory pressure: %v, want a 503", err)
	}
	echoOnce(t, flowing, fr, "flowing under pressure")
	echoOnce(t, sibling, sr, "sibling under pressure")
	if got := shedCount(t, m, "socks5", telemetry.ShedMemoryPressure); got != 3 {
		t.Errorf("shed{socks5, memory_pressure} = %v, want 3", got)
	}
	if got := shedCount(t, m, "inbound", telemetry.ShedMemoryPressure); got != 1 {
		t.Errorf("shed{inbound, memory_pressure} = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "refusing new connections: memory pressure"); n != 1 {
		t.Errorf("%d shedding log lines for 4 refusals within a second, want 1 (rate-limited)", n)
	}

	// Between the marks the sampler keeps refusing (several samples at
	// the 5 ms interval).
	used.Store(800)
	time.Sleep(50 * time.Millisecond)
	if !adm.MemoryPressure() {
		t.Fatal("accepting again at memory 800 of 1000, between the low- and high-water marks")
	}
	setMemory(700, false)
	c, err := socks.Dial("tcp", echo)
	if err != nil {
		t.Fatalf("SOCKS5 connection below the low-water mark: %v", err)
	}
	defer c.Close()
	echoOnce(t, c, bufio.NewReader(c), "after")
	s, err := cc.Connect(cctx, local, nil)
	if err != nil {
		t.Fatalf("CONNECT below the low-water mark: %v", err)
	}
	defer s.Close()
	echoOnce(t, s, bufio.NewReader(s), "stream after")
}

// The DNS admission tests' workload, on 127.92.2.0/24.
const admitDNSWorkloadIP = "127.92.2.2"

// serveDNSProxy serves a proxy for a workload on ip with its DNS proxy on
// ip and adm as its admission control; it returns the proxy and the
// address of its DNS proxy's TCP listener.
func serveDNSProxy(t *testing.T, ip string, m *telemetry.Metrics, adm *admission.Controller) (*Proxy, string) {
	t.Helper()
	_, _, ca, _, store := oneWorkload(t, admitEchoIP, ip)
	p := serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/w", BindAddr: netip.MustParseAddr(ip),
		Store: store, Certs: issuedCerts{ca}, Metrics: m, Admission: adm,
		DNS:      dns.NewResolver(dns.Config{Metrics: dns.NewMetrics(prometheus.NewRegistry())}),
		DNSAddrs: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr(ip), freeUDPPort(t, ip))},
	}, 100*time.Millisecond)
	_, tcp := p.dns.Addrs()
	return p, tcp[0].String()
}

// dnsAnswered reports whether a query over a new TCP connection to addr
// is answered, with any response code; the error says why not.
func dnsAnswered(addr string) error {
	c, err := mdns.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second)) // a hang guard
	q := new(mdns.Msg)
	q.SetQuestion("w.ns.svc.cluster.local.", mdns.TypeA)
	if err := c.WriteMsg(q); err != nil {
		return err
	}
	resp, err := c.ReadMsg()
	if err == nil && resp.Id != q.Id {
		err = fmt.Errorf("reply id %d to query id %d", resp.Id, q.Id)
	}
	return err
}

// refused reports whether a new TCP connection to addr is refused or
// reset before any byte comes back; the error says why not.
func refused(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil // reset before the dial returned
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second)) // a hang guard
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("read = %v, want a reset or EOF", err)
	}
	return nil
}

// TestAdmissionShedsDNSUnderMemoryPressure (issue 36 item 5): above the
// high-water mark a new TCP connection to the DNS proxy is reset as one to
// 15001 is, each counted in gozt_connections_shed_total under its
// listener; below the low-water mark the DNS proxy answers over TCP again.
func TestAdmissionShedsDNSUnderMemoryPressure(t *testing.T) {
	var used atomic.Uint64
	adm := admission.New(admission.Config{MemoryLimit: 1000, Interval: 5 * time.Millisecond, ReadMemory: used.Load})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- adm.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	m := telemetry.NewMetrics(prometheus.NewRegistry())
	_, dnsTCP := serveDNSProxy(t, admitDNSWorkloadIP, m, adm)
	if err := dnsAnswered(dnsTCP); err != nil {
		t.Fatalf("DNS over TCP before any pressure: %v", err)
	}
	setMemory := func(v uint64, want bool) { t.Helper(); setMemoryUsed(t, adm, &used, v, want) }
	setMemory(900, true)
	if err := refused(admitDNSWorkloadIP + ":15001"); err != nil {
		t.Errorf("15001 under memory pressure: %v", err)
	}
	if err := dnsAnswered(dnsTCP); err == nil {
		t.Error("DNS over TCP under memory pressure was answered; 15001 refuses")
	}
	for _, listener := range []string{"outbound", "dns"} {
		if got := shedCount(t, m, listener, telemetry.ShedMemoryPressure); got != 1 {
			t.Errorf("shed{%s, memory_pressure} = %v, want 1", listener, got)
		}
	}
	setMemory(700, false)
	if err := dnsAnswered(dnsTCP); err != nil {
		t.Errorf("DNS over TCP below the low-water mark: %v", err)
	}
}

// setMemoryUsed makes the memory adm reads v (of a limit of 1000, through
// used) and waits until its MemoryPressure is want.
func setMemoryUsed(t *testing.T, adm *admission.Controller, used *atomic.Uint64, v uint64, want bool) {
	t.Helper()
	used.Store(v)
	for start := time.Now(); adm.MemoryPressure() != want; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("MemoryPressure() != %v 5s after memory %d of 1000", want, v)
		}
	}
}
