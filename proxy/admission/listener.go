package admission

import (
	"errors"
	"net"
)

// Listener is a listener whose Accept returns only the connections
// admission control admits: a failed accept is handed to Failed, which
// backs off or, out of descriptors, sheds the queue (never spinning), and
// a connection accepted is handed to Admit, which resets it under memory
// pressure. Every listener of a proxy accepts through one: its own and
// its DNS proxy's TCP listeners (dns.ServerConfig.AdmitTCP), whose
// miekg/dns serve loop would otherwise retry EMFILE at once, for ever, and
// accept while every other listener sheds.
//
// Accept is called by one goroutine at a time (the listener's accept loop).
type Listener struct {
	net.Listener
	// Failed handles a failed Accept, the failures-th in a row: any error
	// but a closed listener's or a timeout. It must not return at once on
	// an error that lasts, or Accept spins. Required.
	Failed func(err error, failures int)
	// Accepted, if non-nil, is called after each successful Accept,
	// before Admit: the shedding of a failure streak ends there.
	Accepted func()
	// Admit reports whether c may be served; if not, it has counted, logged
	// and reset c. Required.
	Admit func(c net.Conn) bool

	failures int // consecutive failed Accepts
}

// Accept returns the next admitted connection, or net.ErrClosed once the
// listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.failures++
			l.Failed(err, l.failures)
			continue
		}
		l.failures = 0
		if l.Accepted != nil {
			l.Accepted()
		}
		if l.Admit(c) {
			return c, nil
		}
	}
}
