package bench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"net"
	"strings"
	"sync"

	"github.com/gozt/gozt/certs"
)

// The test server's protocol: the client's first byte picks the mode.
const (
	// modeEcho echoes every byte until the client's EOF.
	modeEcho = 'E'
	// modeUpload reads until the client's EOF, then answers the byte
	// count as 8 bytes, big-endian.
	modeUpload = 'U'
	// modeDownload writes until the connection fails.
	modeDownload = 'D'
)

// bulkBuf is the read and write size of the bulk modes, at both ends: large
// enough that direct loopback TCP, the baseline, is not held back by
// syscalls.
const bulkBuf = 256 << 10

// appRole is the test server ("app"): the destination of every scenario,
// on plain TCP and on mutual TLS.
type appRole struct {
	noCommands
	srv  connServer
	addr map[string]string
}

func startApp(ctx context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	tcp := fs.String("tcp", "", "comma-separated `ADDRS` to serve plain TCP on")
	tlsAddr := fs.String("tls", "", "`ADDR` to serve mutual TLS on")
	caDir := fs.String("ca-dir", "", "CA directory (for --tls)")
	id := fs.String("identity", "", "SPIFFE identity of the TLS server")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	a := &appRole{addr: map[string]string{}}
	for _, addr := range strings.Split(*tcp, ",") {
		if addr == "" {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			a.srv.close()
			return nil, err
		}
		a.addr["tcp "+addr] = l.Addr().String()
		a.srv.serve(l, a.handle)
	}
	if *tlsAddr != "" {
		cert, err := issue(ctx, *caDir, *id)
		if err != nil {
			a.srv.close()
			return nil, err
		}
		l, err := net.Listen("tcp", *tlsAddr)
		if err != nil {
			a.srv.close()
			return nil, err
		}
		cfg := certs.ServerConfig(func(context.Context) (*certs.Cert, error) { return cert, nil })
		a.addr["tls"] = l.Addr().String()
		a.srv.serve(tls.NewListener(l, cfg), a.handle)
	}
	return a, nil
}

func (a *appRole) info() map[string]string { return a.addr }
func (a *appRole) close() error            { a.srv.close(); return nil }

// handle serves one connection of the test protocol.
func (a *appRole) handle(c net.Conn) {
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case modeEcho:
		buf := make([]byte, 1<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	case modeUpload:
		buf := make([]byte, bulkBuf)
		var total uint64
		for {
			n, err := c.Read(buf)
			total += uint64(n)
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return
			}
		}
		var out [8]byte
		binary.BigEndian.PutUint64(out[:], total)
		c.Write(out[:])
	case modeDownload:
		buf := make([]byte, bulkBuf)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}
}

// connServer runs accept loops and tracks their connections so that close
// can end them all and wait.
type connServer struct {
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// serve accepts on l until close, running handle for each connection on
// its own goroutine; handle need not close the connection.
func (s *connServer) serve(l net.Listener, handle func(net.Conn)) {
	s.mu.Lock()
	s.listeners = append(s.listeners, l)
	if s.conns == nil {
		s.conns = make(map[net.Conn]struct{})
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if !s.track(c) {
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				handle(c)
			}()
		}
	}()
}

func (s *connServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *connServer) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// count is the number of open connections.
func (s *connServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// close stops accepting, closes every connection and waits for the
// handlers.
func (s *connServer) close() {
	s.mu.Lock()
	s.closed = true
	for _, l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
