package proxy

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/telemetry"
)

// TestAdmissionShedsDNSOutOfDescriptors (issue 36 item 5): out of file
// descriptors, a TCP connection queued on the DNS proxy is reset with the
// spare descriptor as one queued on 15001 is, each counted in
// gozt_connections_shed_total{reason="fd_exhausted"} under its listener,
// and readiness learns of it; once descriptors are back the DNS proxy
// answers over TCP again. (The DNS server alone only backs off EMFILE:
// the queued client would wait.)
func TestAdmissionShedsDNSOutOfDescriptors(t *testing.T) {
	const ip = "127.92.2.3"
	adm := admission.New(admission.Config{})
	m := telemetry.NewMetrics(prometheus.NewRegistry())
	p, dnsTCP := serveDNSProxy(t, ip, m, adm)
	// One at a time: the accept loops share the spare descriptor, whose
	// slot one loop's accept can take while another sheds (accept.go), so
	// each connects only once the shed before it has taken the spare back.
	targets := []struct {
		name string
		addr netip.AddrPort
		fd   int
	}{
		{name: "outbound", addr: netip.AddrPortFrom(netip.MustParseAddr(ip), OutboundPort)},
		{name: "dns", addr: netip.MustParseAddrPort(dnsTCP)},
	}
	// The clients' sockets exist before the descriptors run out; connecting
	// them takes none.
	for i := range targets {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		// A hang guard on the read below, not a timing assertion.
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
			t.Fatal(err)
		}
		targets[i].fd = fd
	}
	restore := proctest.LeaveDescriptors(t, 0)
	if !proctest.NoneLeft() {
		restore()
		t.Fatal("a descriptor is left: a socket closed after LeaveDescriptors")
	}
	results := make([]error, len(targets))
	for i, tg := range targets {
		sa := &unix.SockaddrInet4{Addr: tg.addr.Addr().As4(), Port: int(tg.addr.Port())}
		if err := unix.Connect(tg.fd, sa); err != nil {
			restore()
			t.Fatalf("connect to %s: %v", tg.name, err)
		}
		_, results[i] = unix.Read(tg.fd, make([]byte, 1))
		p.accept.mu.Lock() // held by the shed until it ends
		spare := p.accept.spare != nil
		p.accept.mu.Unlock()
		if !spare {
			restore()
			t.Fatalf("the spare descriptor was lost shedding %s", tg.name)
		}
	}
	exhausted := adm.FDExhausted()
	restore()
	for i, tg := range targets {
		if !errors.Is(results[i], unix.ECONNRESET) {
			t.Errorf("a connection to %s queued while out of descriptors: read = %v, want a reset", tg.name, results[i])
		}
		// acceptFailed counts the connections shedQueued reset after
		// the resets.
		for start := time.Now(); shedCount(t, m, tg.name, telemetry.ShedFDExhausted) == 0 && time.Since(start) < 5*time.Second; {
			time.Sleep(time.Millisecond)
		}
		if got := shedCount(t, m, tg.name, telemetry.ShedFDExhausted); got != 1 {
			t.Errorf("shed{%s, fd_exhausted} = %v, want 1", tg.name, got)
		}
	}
	if !exhausted {
		t.Error("FDExhausted() = false while the accept loops shed")
	}
	// A connection that comes as the descriptors do can still meet the
	// last shed: an accept that failed just before restore sheds what is
	// queued by then. So a reset is tried again; the proxy must answer
	// within the hang guard.
	err := dnsAnswered(dnsTCP)
	for start := time.Now(); errors.Is(err, unix.ECONNRESET) && time.Since(start) < 5*time.Second; {
		time.Sleep(10 * time.Millisecond)
		err = dnsAnswered(dnsTCP)
	}
	if err != nil {
		t.Errorf("DNS over TCP with descriptors back: %v", err)
	}
}
