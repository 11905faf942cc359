package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gozt/gozt/internal/workers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop))
}

// testPair is a Server and a ClientConn connected over a real loopback TCP
// connection (or net.Pipe).
type testPair struct {
	t      testing.TB
	srv    *Server
	cc     *ClientConn
	served chan error
}

type pairOpts struct {
	srv, cli Config
	pipe     bool
}

// newPair starts srv.ServeConn on one end of a connection and a ClientConn on
// the other. Cleanup closes both and waits for ServeConn.
func newPair(t testing.TB, h Handler, o pairOpts) *testPair {
	t.Helper()
	cn, sn := connPair(t, o.pipe)
	o.srv.Logger = debugLogger()
	p := &testPair{t: t, srv: &Server{Config: o.srv, Handler: h}, served: make(chan error, 1)}
	go func() { p.served <- p.srv.ServeConn(context.Background(), sn) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cc, err := NewClientConn(ctx, cn, o.cli)
	if err != nil {
		t.Fatalf("NewClientConn: %v", err)
	}
	p.cc = cc
	t.Cleanup(func() {
		cc.Close()
		p.srv.Close()
		select {
		case <-p.served:
		case <-time.After(10 * time.Second):
			t.Errorf("ServeConn did not return")
		}
	})
	return p
}

// connPair returns two connected net.Conns: client end, server end.
func connPair(t testing.TB, pipe bool) (net.Conn, net.Conn) {
	t.Helper()
	if pipe {
		return net.Pipe()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	cn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return cn, r.c
}

func (p *testPair) connect(ctx context.Context) *ClientStream {
	p.t.Helper()
	s, err := p.cc.Connect(ctx, "10.0.0.1:8080", nil)
	if err != nil {
		dumpConn(p.t, p.cc.c)
		p.t.Fatalf("Connect: %v", err)
	}
	return s
}

// payload returns n deterministic pseudo-random bytes.
func payload(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeChunks writes b in random chunk sizes up to maxChunk.
func writeChunks(w io.Writer, b []byte, seed uint64, maxChunk int) error {
	r := rand.New(rand.NewPCG(seed, 7))
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(maxChunk))
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// echoHandler answers 200 and echoes, half-closing when the client does.
func echoHandler(s *ServerStream) {
	if s.Method() != http.MethodConnect {
		s.Respond(http.StatusBadRequest, nil)
		return
	}
	if err := s.Respond(http.StatusOK, nil); err != nil {
		return
	}
	defer s.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				s.CloseWrite()
				// Wait until the client is done too (it closes the stream).
				s.Read(buf)
			}
			return
		}
	}
}

// readAllCompare reads r to EOF and compares with want, failing with the first
// differing offset.
// echoExchange writes want to s in chunks of at most maxChunk bytes (sizes
// drawn from seed), half-closes, and meanwhile reads the echo back to EOF
// and compares it. It returns the first failure; after a read failure it
// does not wait for the writer.
func echoExchange(s interface {
	io.ReadWriter
	CloseWrite() error
}, want []byte, seed uint64, maxChunk int) error {
	w := runAsync(func() error {
		if err := writeChunks(s, want, seed, maxChunk); err != nil {
			return err
		}
		return s.CloseWrite()
	})
	if err := readAllCompare(s, want); err != nil {
		return err
	}
	return <-w
}

func readAllCompare(r io.Reader, want []byte) error {
	got, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		return errors.New("payload mismatch: got " + itoa(len(got)) + " bytes, want " + itoa(len(want)) + ", first difference at " + itoa(i))
	}
	return nil
}

func itoa(n int) string { return fmtInt(n) }

func fmtInt(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// runAsync runs f on a goroutine and returns a channel with its error.
func runAsync(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func wait(t testing.TB, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: timed out", what)
	}
}
