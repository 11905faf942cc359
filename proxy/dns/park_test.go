package dns

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/sockwait"
)

// newSet returns a Set closed when the test ends.
func newSet(t testing.TB) *sockwait.Set {
	s := sockwait.New()
	t.Cleanup(func() { s.Close() })
	return s
}

// parking returns the config edit that parks a server's sockets in set
// after idle; nothing if set is nil.
func parking(set *sockwait.Set, idle time.Duration) func(*ServerConfig) {
	return func(cfg *ServerConfig) {
		if set != nil {
			cfg.Sockets, cfg.Idle = set, idle
		}
	}
}

// serverGoroutines returns the stacks of the goroutines running a
// Server's code: its loops, queries and connections.
func serverGoroutines() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var gs []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "gozt/gozt/proxy/dns.(*Server).") {
			gs = append(gs, g)
		}
	}
	return gs
}

// waitFor fails t if cond is not true within 5 s (a hang guard).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("not %s after 5s", what)
		}
	}
}

// waitNoServerGoroutine fails t if goroutines run a Server's code 5 s on.
func waitNoServerGoroutine(t testing.TB) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		gs := serverGoroutines()
		if len(gs) == 0 {
			return
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d goroutines run the server's code:\n%s", len(gs), strings.Join(gs, "\n\n"))
		}
	}
}

// startParking listens and starts a server of the fixture mesh on ip
// that parks its sockets in a new Set after idle; the test's end shuts
// it down and checks that no goroutine runs its code. It returns the
// server, the Set and its UDP and TCP addresses.
func startParking(t *testing.T, ip string, idle time.Duration) (*Server, *sockwait.Set, string, string) {
	t.Helper()
	set := newSet(t)
	srv := newLoopServer(t, ip, parking(set, idle))
	if err := srv.Listen(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if gs := serverGoroutines(); len(gs) != 0 {
			t.Errorf("%d goroutines run the server's code after Shutdown:\n%s", len(gs), strings.Join(gs, "\n\n"))
		}
	})
	if !srv.Start() {
		t.Fatal("Start = false")
	}
	udp, tcp := srv.Addrs()
	return srv, set, udp[0].String(), tcp[0].String()
}

// ask exchanges one query over network with addr and fails t unless it
// is answered NOERROR.
func ask(t testing.TB, network, addr string) {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 10 * time.Second} // a hang guard
	resp, _, err := c.Exchange(question("svc1", dns.TypeA), addr)
	if err != nil {
		t.Fatalf("query over %s: %v", network, err)
	}
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Fatalf("query over %s: %s, %d answers; want NOERROR with the answer", network, dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
}

// TestParkedAtStart: with a Set, Start parks every socket, and no
// goroutine runs the server's code.
func TestParkedAtStart(t *testing.T) {
	_, set, _, _ := startParking(t, "127.83.6.1", time.Minute)
	if got := set.Parked(); got != 2 {
		t.Errorf("Parked() after Start = %d, want 2 (UDP and TCP)", got)
	}
	if gs := serverGoroutines(); len(gs) != 0 {
		t.Errorf("%d goroutines run the server's code after Start, want none:\n%s", len(gs), strings.Join(gs, "\n\n"))
	}
}

// TestParkedSocketsAnswer: a query to a parked UDP socket and one over a
// connection to a parked TCP listener are answered; after the idle time
// both park again and no goroutine is left; and again.
func TestParkedSocketsAnswer(t *testing.T) {
	_, set, udp, tcp := startParking(t, "127.83.6.2", 20*time.Millisecond)
	for round := range 3 {
		ask(t, "udp", udp)
		ask(t, "tcp", tcp)
		waitFor(t, "both sockets parked again", func() bool { return set.Parked() == 2 })
		waitNoServerGoroutine(t)
		if t.Failed() {
			t.Fatalf("round %d", round)
		}
	}
}

// sleepyHooks admit every connection and wait a millisecond after a
// failed accept.
type sleepyHooks struct{}

func (sleepyHooks) Failed(error, int)   { time.Sleep(time.Millisecond) }
func (sleepyHooks) Accepted()           {}
func (sleepyHooks) Admit(net.Conn) bool { return true }

// TestParkedAdmittedListener: a TCP listener that AdmitTCP wraps parks
// when its admission.Listener reports the idle time the server gave it.
func TestParkedAdmittedListener(t *testing.T) {
	set := newSet(t)
	srv := newLoopServer(t, "127.83.6.3", func(cfg *ServerConfig) {
		parking(set, 20*time.Millisecond)(cfg)
		cfg.AdmitTCP = func(l net.Listener) *admission.Listener {
			return &admission.Listener{Listener: l, Hooks: sleepyHooks{}}
		}
	})
	_, tcp := runServer(t, srv)
	for range 2 {
		ask(t, "tcp", tcp)
		waitFor(t, "both sockets parked again", func() bool { return set.Parked() == 2 })
	}
}

// TestShutdownParked: Shutdown with both sockets parked returns at once,
// closes them and leaves nothing parked and no goroutine.
func TestShutdownParked(t *testing.T) {
	srv, set, udp, tcp := startParking(t, "127.83.6.4", time.Minute)
	start := time.Now()
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Shutdown of parked sockets took %v, want at once", d)
	}
	if got := set.Parked(); got != 0 {
		t.Errorf("Parked() after Shutdown = %d, want 0", got)
	}
	if c, err := net.DialTimeout("tcp", tcp, time.Second); err == nil {
		c.Close()
		t.Error("the TCP listener accepts after Shutdown")
	}
	if c, err := net.ListenPacket("udp", udp); err != nil {
		t.Errorf("the UDP address is still bound after Shutdown: %v", err)
	} else {
		c.Close()
	}
}

// TestShutdownRunning: Shutdown with both loops running, waiting within
// their idle time, returns at once and leaves no goroutine.
func TestShutdownRunning(t *testing.T) {
	srv, set, udp, tcp := startParking(t, "127.83.6.5", time.Minute)
	ask(t, "udp", udp)
	ask(t, "tcp", tcp)
	if got := set.Parked(); got != 0 {
		t.Fatalf("Parked() within the idle time after queries = %d, want 0", got)
	}
	start := time.Now()
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Shutdown of running loops took %v, want at once", d)
	}
}

// TestShutdownRacesWake: Shutdown as a query wakes a parked socket, or as
// its loop parks it again, ends every loop once (run with -race and
// -count; a loop ended twice panics the WaitGroup, one not ended hangs
// Shutdown).
func TestShutdownRacesWake(t *testing.T) {
	for i := range 20 {
		srv, _, udp, tcp := startParking(t, "127.83.6.6", time.Millisecond)
		c, err := net.Dial("udp", udp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(withID(t, question("svc1", dns.TypeA), 1)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			time.Sleep(time.Duration(i/2) * 100 * time.Microsecond)
		}
		tc, _ := net.Dial("tcp", tcp)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a hang guard
		err = srv.Shutdown(ctx)
		cancel()
		c.Close()
		if tc != nil {
			tc.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		waitNoServerGoroutine(t)
	}
}

// TestIdleUDPReadWait: an idle UDP loop wakes for nothing: without a Set
// it sets no read deadline at all (miekg/dns's server woke every 5 s, two
// per pod in shared mode: bench/NOTES.md); with one it sets one per idle
// window, not one per datagram.
func TestIdleUDPReadWait(t *testing.T) {
	const queries = 50
	for _, tc := range []struct {
		name            string
		ip              string
		set             *sockwait.Set
		atLeast, atMost int
	}{
		{"unparked", "127.83.6.7", nil, 0, 0},
		{"parked", "127.83.6.8", newSet(t), 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newLoopServer(t, tc.ip, parking(tc.set, 5*time.Second))
			udp, _ := runServer(t, srv)
			for range queries {
				ask(t, "udp", udp)
			}
			if err := srv.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, l := range srv.listeners {
				if l.network == "udp" && (l.deadlines < tc.atLeast || l.deadlines > tc.atMost) {
					t.Errorf("the UDP loop set %d read deadlines for %d queries, want %d to %d", l.deadlines, queries, tc.atLeast, tc.atMost)
				}
			}
		})
	}
}
