package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// The mesh of the early-data tests, on 127.93.1.0/24: a client and a
// server workload, each with its own proxy.
const (
	edClientIP = "127.93.1.2"
	edServerIP = "127.93.1.3"
)

// countingBackend accepts connections on a server port and counts them and
// the bytes they carried, echoing nothing.
type countingBackend struct {
	addr netip.AddrPort
	mu   sync.Mutex
	n    int
	got  []byte
	wg   sync.WaitGroup
}

func startCountingBackend(t *testing.T, ip string) *countingBackend {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	b := &countingBackend{addr: l.Addr().(*net.TCPAddr).AddrPort()}
	b.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.n++
			b.mu.Unlock()
			b.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					b.mu.Lock()
					b.got = append(b.got, buf[:n]...)
					b.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		b.wg.Wait()
	})
	return b
}

func (b *countingBackend) counts() (int, []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, append([]byte(nil), b.got...)
}

// earlyMesh starts the server's inbound proxy and the client's proxy
// (SOCKS5 on), with a policy denying the client on denyPort, and returns
// the client proxy's metrics registry.
func earlyMesh(t *testing.T, denyPort uint16, allowPort uint16) *prometheus.Registry {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store := storeWith(t, func(b *state.Batch) []error {
		return []error{
			b.InsertWorkload(nsWorkload("client", edClientIP)),
			b.InsertWorkload(nsWorkload("server", edServerIP)),
			b.InsertPolicy(&rbac.Policy{
				Name: "deny-client", Namespace: "ns", Scope: rbac.Namespace, Action: rbac.Deny,
				Rules: []rbac.Rule{{Clauses: []rbac.Clause{
					{Matches: []rbac.Match{{Principals: []rbac.StringMatch{{Kind: rbac.Exact, Value: "cluster.local/ns/ns/sa/client"}}}}},
					{Matches: []rbac.Match{{DestinationPorts: []uint16{denyPort}}}},
				}}},
			}),
		}
	})
	quiet := slog.New(slog.DiscardHandler)
	serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/server", BindAddr: netip.MustParseAddr(edServerIP), InboundOnly: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()), AccessLog: quiet,
	}, 5*time.Second)
	reg := prometheus.NewRegistry()
	serveProxy(t, Config{
		WorkloadUID: "c//Pod/ns/client", BindAddr: netip.MustParseAddr(edClientIP), EnableSOCKS5: true,
		Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(reg), AccessLog: quiet,
	}, 5*time.Second)
	return reg
}

// socksFirst dials the client proxy's SOCKS5 port and sends the greeting,
// the CONNECT request for dst and first in one write, as a client that
// speaks first and pipelines its handshake does; it reads the reply.
func socksFirst(t *testing.T, dst netip.AddrPort, first []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", net.JoinHostPort(edClientIP, strconv.Itoa(SOCKS5Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ip4 := dst.Addr().As4()
	req := append([]byte{5, 1, 0, 5, 1, 0, 1}, ip4[:]...)
	req = append(req, byte(dst.Port()>>8), byte(dst.Port()))
	if _, err := c.Write(append(req, first...)); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 12)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, reply); err != nil || reply[3] != socksRepSuccess {
		t.Fatalf("socks5 connect %s: reply % x, %v", dst, reply, err)
	}
	return c
}

// TestEarlyBytesToDeniedTarget (TESTPLAN S27, through gozt's own
// outbound, which sends the client's first bytes with the CONNECT): a
// denied destination is never dialed and receives nothing; the client's
// connection is reset, as it is when the proxy closes a socket holding the
// client's unread bytes; and an allowed destination gets every byte, the
// early ones first, counted in the source's request bytes.
func TestEarlyBytesToDeniedTarget(t *testing.T) {
	denied := startCountingBackend(t, edServerIP)
	allowed := startCountingBackend(t, edServerIP)
	reg := earlyMesh(t, denied.addr.Port(), allowed.addr.Port())
	first := []byte("POST /admin HTTP/1.1\r\nContent-Length: 5\r\n\r\nsmugl")

	c := socksFirst(t, denied.addr, first)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 100))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("denied connection read %d bytes, %v; want a reset", n, err)
	}
	if n, got := denied.counts(); n != 0 || len(got) != 0 {
		t.Errorf("denied destination accepted %d connections and received %q", n, got)
	}

	c = socksFirst(t, allowed.addr, first)
	if _, err := c.Write([]byte(" and after")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	want := string(first) + " and after"
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, got := allowed.counts()
		if string(got) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("allowed destination received %q, want %q", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Close()
	deadline = time.Now().Add(10 * time.Second)
	for {
		if got := counterSum(t, reg, "istio_tcp_received_bytes_total", "source"); got == float64(len(want)) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("source counted %v request bytes, want %d", got, len(want))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n, got := denied.counts(); n != 0 || len(got) != 0 {
		t.Errorf("denied destination accepted %d connections and received %q", n, got)
	}
}

// counterSum sums counter name's series with reporter.
func counterSum(t *testing.T, reg *prometheus.Registry, name, reporter string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reporter" && lp.GetValue() == reporter {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestNoEarlyData: by default the destination's proxy sees the client's
// first bytes before it answers the CONNECT; with NoEarlyData
// (HBONE_EARLY_DATA=false) it sees none until it has answered, as from
// ztunnel. The destination here is a bare HBONE server on 127.93.2.3 that
// looks for bytes for up to 1 s before its 200 (returning as soon as they
// arrive), then echoes.
func TestNoEarlyData(t *testing.T) {
	const clientIP, serverIP = "127.93.2.2", "127.93.2.3"
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(context.Background(), identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "server"})
	if err != nil {
		t.Fatal(err)
	}
	sawEarly := make(chan bool, 1)
	srv := &hbone.Server{Handler: func(s *hbone.ServerStream) {
		defer s.Close()
		s.SetReadDeadline(time.Now().Add(time.Second)) // wide, so a slow machine does not read "on" as "off"
		buf := make([]byte, 64)
		n, _ := s.Read(buf)
		sawEarly <- n > 0
		s.SetReadDeadline(time.Time{})
		s.Respond(http.StatusOK, nil)
		if n == 0 {
			n, _ = s.Read(buf)
		}
		s.Write(buf[:n])
	}}
	listenHBONE(t, net.JoinHostPort(serverIP, strconv.Itoa(HBONEPort)), cert, srv, nil)

	store := storeWith(t, func(b *state.Batch) []error {
		return []error{b.InsertWorkload(nsWorkload("client", clientIP)), b.InsertWorkload(nsWorkload("server", serverIP))}
	})
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoEarlyData=%v", off), func(t *testing.T) {
			serveProxy(t, Config{
				WorkloadUID: "c//Pod/ns/client", BindAddr: netip.MustParseAddr(clientIP), EnableSOCKS5: true, NoEarlyData: off,
				Store: store, Certs: issuedCerts{ca}, Metrics: telemetry.NewMetrics(prometheus.NewRegistry()), AccessLog: slog.New(slog.DiscardHandler),
			}, 5*time.Second)
			c, err := net.Dial("tcp", net.JoinHostPort(clientIP, strconv.Itoa(SOCKS5Port)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ip4 := netip.MustParseAddr(serverIP).As4()
			req := append([]byte{5, 1, 0, 5, 1, 0, 1}, ip4[:]...)
			req = append(req, 0, 80)
			if _, err := c.Write(append(req, "hello"...)); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := make([]byte, 12+5) // the SOCKS5 reply, then the echo
			if _, err := io.ReadFull(c, got); err != nil || string(got[12:]) != "hello" {
				t.Fatalf("read % x, %v; want the reply and the echo", got, err)
			}
			if early := <-sawEarly; early == off {
				t.Errorf("the destination saw the client's bytes before its 200: %v, want %v", early, !off)
			}
		})
	}
}
