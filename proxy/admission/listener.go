package admission

import (
	"errors"
	"net"
	"time"
)

// Listener is a listener whose Accept returns only the connections
// admission control admits: a failed accept is handed to its Hooks'
// Failed, which backs off or, out of descriptors, sheds the queue (never
// spinning), and a connection accepted to Admit, which resets it under
// memory pressure. Every listener of a proxy accepts through one: its own and
// its DNS proxy's TCP listeners (dns.ServerConfig.AdmitTCP), which would
// otherwise only back off a failed accept, and accept while every other
// listener sheds.
//
// Accept is called by one goroutine at a time (the listener's accept loop).
type Listener struct {
	net.Listener
	// Hooks is the owner's side of admission control. Required.
	Hooks Hooks
	// Idle, if non-zero, makes Accept return ErrIdle once no connection has
	// come for Idle to twice Idle, so that the accept loop can park the
	// socket (proxy/sockwait) rather than wait on its goroutine. It sets
	// the wrapped listener's deadline, once per Idle, not per connection;
	// a listener without SetDeadline never idles.
	Idle time.Duration

	failures int       // failed Accepts in the current streak
	lastFail time.Time // when the last one failed
	armed    bool      // the deadline of the current Idle window is set
	busy     bool      // a connection came in the current Idle window
}

// Hooks is what a Listener asks of its owner. It is an interface, not
// three functions, so that an owner holding what the hooks need (a proxy's
// listener: the proxy and the listener's name) implements it without a
// closure per hook and per listener: a node in shared mode has up to five
// listeners per pod.
type Hooks interface {
	// Failed handles a failed Accept, the failures-th of its streak: any
	// error but a closed listener's or a timeout. A streak ends only once
	// streakGap passes without a failure, not at the next success: a
	// process at its descriptor limit, where a descriptor freed now and
	// then lets one accept through between failures, is still in one
	// streak, so Failed's shedding starts there too (without it the queue
	// drained one connection per back-off while its clients waited,
	// TestFDExhaustion). It must not return at once on an error that
	// lasts, or Accept spins.
	Failed(err error, failures int)
	// Accepted is called after each successful Accept, before Admit: the
	// shedding of a failure streak ends there.
	Accepted()
	// Admit reports whether c may be served; if not, it has counted, logged
	// and reset c.
	Admit(c net.Conn) bool
}

// streakGap is how long a listener goes without a failed Accept before its
// failure streak ends (Hooks.Failed).
const streakGap = time.Second

// ErrIdle is Accept's error when Listener.Idle has passed with no
// connection. The listener stays open; the next Accept waits again.
var ErrIdle = errors.New("admission: listener idle")

// deadliner is a listener that takes a deadline, as *net.TCPListener does.
type deadliner interface{ SetDeadline(time.Time) error }

// Accept returns the next admitted connection, net.ErrClosed once the
// listener is closed, or ErrIdle (Idle).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		if l.Idle > 0 && !l.armed {
			if d, ok := l.Listener.(deadliner); ok && d.SetDeadline(time.Now().Add(l.Idle)) == nil {
				l.armed, l.busy = true, false
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if l.armed {
					l.armed = false
					if !l.busy {
						return nil, ErrIdle
					}
				}
				continue
			}
			if l.failures > 0 && time.Since(l.lastFail) >= streakGap {
				l.failures = 0
			}
			l.failures++
			l.lastFail = time.Now()
			l.Hooks.Failed(err, l.failures)
			continue
		}
		l.busy = true
		l.Hooks.Accepted()
		if l.Hooks.Admit(c) {
			return c, nil
		}
	}
}
