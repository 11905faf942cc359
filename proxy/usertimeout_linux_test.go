package proxy

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// TestUserTimeoutListeners: Config.UserTimeout (USER_TIMEOUT_ENABLED) is
// set on the 15001 and 15006 listeners, whose accepted sockets inherit it,
// and not on 15008, as ztunnel sets it only where it sets keep-alive.
func TestUserTimeoutListeners(t *testing.T) {
	const ip = "127.88.253.3"
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(ip), UserTimeout: 20 * time.Second,
		Store: state.NewStore(state.Config{}), Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()),
	}, 5*time.Second)
	p.mu.Lock()
	listeners := map[string]net.Listener{}
	for name, l := range p.listeners {
		listeners[name] = l
	}
	p.mu.Unlock()
	want := map[string]int{"outbound": 20000, "plaintext": 20000, "inbound": 0}
	for name, ms := range want {
		l, ok := listeners[name]
		if !ok {
			t.Fatalf("no %s listener", name)
		}
		rc, err := l.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		if err := rc.Control(func(fd uintptr) {
			got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		}); err != nil {
			t.Fatal(err)
		}
		if gerr != nil && ms == 0 {
			// Go makes listeners MPTCP when it can (and falls back to TCP
			// when an option does not apply to MPTCP, as TCP_USER_TIMEOUT
			// does not); an MPTCP listener has no TCP_USER_TIMEOUT at all.
			continue
		}
		if gerr != nil {
			t.Fatalf("%s listener: getsockopt TCP_USER_TIMEOUT: %v", name, gerr)
		}
		if got != ms {
			t.Errorf("%s listener: TCP_USER_TIMEOUT = %d ms, want %d", name, got, ms)
		}
	}
}
