package hbone

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// rawTarget is the authority of the raw peer's CONNECT requests.
const rawTarget = "10.0.0.1:80"

// serveResult is the outcome of a ServeConn call, waited for at most once.
type serveResult struct {
	ch   chan error
	once sync.Once
	err  error
	ok   bool
}

// wait returns ServeConn's error; ok is false if it did not return in time.
func (s *serveResult) wait(d time.Duration) (err error, ok bool) {
	s.once.Do(func() {
		select {
		case s.err = <-s.ch:
			s.ok = true
		case <-time.After(d):
		}
	})
	return s.err, s.ok
}

// rawServer starts srv on one end of a TCP connection and returns a raw
// client on the other. Cleanup closes the server and waits for ServeConn.
func rawServer(t testing.TB, srv *Server) (*hbonetest.Peer, *serveResult) {
	t.Helper()
	cn, sn := connPair(t, false)
	res := &serveResult{ch: make(chan error, 1)}
	go func() { res.ch <- srv.ServeConn(context.Background(), sn) }()
	r := hbonetest.NewPeer(t, cn, hbonetest.Config{})
	t.Cleanup(func() {
		srv.Close()
		if _, ok := res.wait(10 * time.Second); !ok {
			t.Errorf("ServeConn did not return")
		}
	})
	return r, res
}

// rawServerPeer starts a ClientConn against a raw peer playing the server
// (preface read, empty SETTINGS sent).
func rawServerPeer(t testing.TB, cfg Config) (*ClientConn, *hbonetest.Peer) {
	t.Helper()
	cn, sn := connPair(t, false)
	return rawServerPeerOver(t, cn, sn, cfg)
}

// rawServerPeerOver starts a ClientConn on cn against a raw peer on sn
// playing the server: it reads the preface and sends settings.
func rawServerPeerOver(t testing.TB, cn, sn net.Conn, cfg Config, settings ...http2.Setting) (*ClientConn, *hbonetest.Peer) {
	t.Helper()
	type result struct {
		cc  *ClientConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		cc, err := NewClientConn(context.Background(), cn, cfg)
		ch <- result{cc, err}
	}()
	buf := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(sn, buf); err != nil || string(buf) != http2.ClientPreface {
		t.Fatalf("client preface %q, %v", buf, err)
	}
	r := hbonetest.NewPeer(t, sn, hbonetest.Config{})
	r.Must(r.Framer.WriteSettings(settings...))
	res := <-ch
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() { res.cc.Close() })
	return res.cc, r
}
