package xdsserver

import (
	"net"
	"sync"
)

// listener wraps accepted connections so that Blackhole can silence them.
type listener struct {
	net.Listener

	mu        sync.Mutex
	blackhole bool
	conns     map[*conn]struct{}
}

func newListener(l net.Listener) *listener {
	return &listener{Listener: l, conns: make(map[*conn]struct{})}
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	wc := &conn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[wc] = struct{}{}
	l.mu.Unlock()
	return wc, nil
}

// blackholed reports whether the blackhole is on.
func (l *listener) blackholed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blackhole
}

// setBlackhole switches the blackhole; switching it off closes the
// connections that lost bytes.
func (l *listener) setBlackhole(on bool) {
	l.mu.Lock()
	l.blackhole = on
	var broken []*conn
	if !on {
		for c := range l.conns {
			if c.dropped() {
				broken = append(broken, c)
			}
		}
	}
	l.mu.Unlock()
	for _, c := range broken {
		c.Close()
	}
}

// conn is an accepted connection that drops all bytes while its listener
// is blackholed.
type conn struct {
	net.Conn
	l *listener

	mu   sync.Mutex
	lost bool // bytes were dropped: the connection is unusable afterwards
}

func (c *conn) markLost() {
	c.mu.Lock()
	c.lost = true
	c.mu.Unlock()
}

// dropped reports whether the connection has lost bytes.
func (c *conn) dropped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

// Read discards what arrives while blackholed; it keeps reading so that the
// peer's writes never block.
func (c *conn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if n > 0 && c.l.blackholed() {
			c.markLost()
			if err != nil {
				return 0, err
			}
			continue
		}
		return n, err
	}
}

// Write pretends to succeed while blackholed.
func (c *conn) Write(p []byte) (int, error) {
	if c.l.blackholed() {
		c.markLost()
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *conn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
