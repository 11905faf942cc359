package admission_test

import (
	"errors"
	"net"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gozt/gozt/proxy/admission"
)

func idleListener(t *testing.T, idle time.Duration) (*admission.Listener, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &admission.Listener{
		Listener: l,
		Hooks: funcHooks{
			failed: func(err error, _ int) { t.Errorf("accept failed: %v", err) },
			admit:  func(net.Conn) bool { return true },
		},
		Idle: idle,
	}, l.Addr().String()
}

// funcHooks are a test's admission hooks, as functions; accepted may be
// nil.
type funcHooks struct {
	failed   func(err error, failures int)
	accepted func()
	admit    func(c net.Conn) bool
}

func (h funcHooks) Failed(err error, failures int) { h.failed(err, failures) }
func (h funcHooks) Admit(c net.Conn) bool          { return h.admit(c) }

func (h funcHooks) Accepted() {
	if h.accepted != nil {
		h.accepted()
	}
}

func dialTCP(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
}

// TestIdleReturnsErrIdle: with no connection for Idle, Accept returns
// ErrIdle, and the listener still accepts afterwards.
func TestIdleReturnsErrIdle(t *testing.T) {
	const idle = 30 * time.Millisecond
	al, addr := idleListener(t, idle)
	start := time.Now()
	if _, err := al.Accept(); !errors.Is(err, admission.ErrIdle) {
		t.Fatalf("Accept with no connection = %v, want ErrIdle", err)
	}
	if d := time.Since(start); d < idle {
		t.Fatalf("ErrIdle after %v, before Idle (%v)", d, idle)
	}
	dialTCP(t, addr)
	c, err := al.Accept()
	if err != nil {
		t.Fatalf("Accept after ErrIdle with a connection waiting = %v", err)
	}
	c.Close()
}

// TestIdleNotWhileBusy: connections closer together than Idle keep Accept
// from returning ErrIdle, however long they go on.
func TestIdleNotWhileBusy(t *testing.T) {
	const idle = 60 * time.Millisecond
	al, addr := idleListener(t, idle)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(idle / 6)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if c, err := net.Dial("tcp", addr); err == nil {
					defer c.Close()
				}
			}
		}
	}()
	deadline := time.Now().Add(5 * idle)
	n := 0
	for time.Now().Before(deadline) {
		c, err := al.Accept()
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("Accept after %d connections = %v, want a connection", n, err)
		}
		c.Close()
		n++
	}
	close(stop)
	<-done
	// Once they stop, it idles again.
	for {
		c, err := al.Accept()
		if errors.Is(err, admission.ErrIdle) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// TestNoIdleWithoutIdle: a Listener with Idle zero never returns ErrIdle
// and never sets a deadline: Accept waits until a connection comes.
func TestNoIdleWithoutIdle(t *testing.T) {
	al, addr := idleListener(t, 0)
	got := make(chan error, 1)
	go func() {
		c, err := al.Accept()
		if c != nil {
			c.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Accept returned %v with no connection", err)
	case <-time.After(100 * time.Millisecond):
	}
	dialTCP(t, addr)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// scripted is a listener whose Accepts return its results in turn: a nil
// error gives a connection.
type scripted struct {
	net.Listener
	results []error
}

func (s *scripted) Accept() (net.Conn, error) {
	if len(s.results) == 0 {
		return nil, net.ErrClosed
	}
	err := s.results[0]
	s.results = s.results[1:]
	if err != nil {
		return nil, err
	}
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

// TestFailureStreakSpansSuccesses: at the descriptor limit an accept now
// and then gets through between failures; the failures still count as one
// streak, so Failed sees it last (and sheds), until a quiet second ends it.
func TestFailureStreakSpansSuccesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		emfile := &net.OpError{Op: "accept", Err: syscall.EMFILE}
		s := &scripted{results: []error{emfile, nil, emfile, nil, emfile, emfile, nil}}
		var got []int
		// Each successful Accept is announced (Accepted), and before
		// its connection is offered to Admit.
		accepted, admitted := 0, 0
		al := &admission.Listener{
			Listener: s,
			Hooks: funcHooks{
				failed:   func(_ error, failures int) { got = append(got, failures) },
				accepted: func() { accepted++ },
				admit: func(c net.Conn) bool {
					if admitted++; accepted != admitted {
						t.Errorf("Admit of connection %d after %d Accepted calls", admitted, accepted)
					}
					c.Close()
					return true
				},
			},
		}
		for range 3 {
			if _, err := al.Accept(); err != nil {
				t.Fatal(err)
			}
		}
		if want := []int{1, 2, 3, 4}; !slices.Equal(got, want) {
			t.Fatalf("failures passed to Failed = %v, want %v: a success does not end the streak", got, want)
		}
		time.Sleep(2 * time.Second) // a quiet second ends it
		got = nil
		s.results = []error{emfile, nil}
		if _, err := al.Accept(); err != nil {
			t.Fatal(err)
		}
		if want := []int{1}; !slices.Equal(got, want) {
			t.Fatalf("after a quiet second, failures = %v, want %v", got, want)
		}
	})
}
