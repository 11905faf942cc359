package proxy

import (
	"bytes"
	"context"
	"net"
	"testing"
)

// bytesConn is a net.Conn reading a fixed input, then EOF, and recording
// what is written: the handshake's peer in FuzzSOCKSHandshake, without a
// goroutine or a deadline per input.
type bytesConn struct {
	net.Conn // nil: only the methods below are used
	in       *bytes.Reader
	out      bytes.Buffer
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *bytesConn) RemoteAddr() net.Addr        { return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1} }

// FuzzSOCKSHandshake feeds socksHandshake arbitrary client bytes. It must
// never panic, must answer at most the method reply, must never read past
// the request it accepts (the client's payload stays for the relay), and
// must accept a request only with a valid target.
func FuzzSOCKSHandshake(f *testing.F) {
	for _, seed := range [][]byte{
		{5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 7, 0x1f, 0x90},
		append([]byte{5, 1, 0, 5, 1, 0, 4}, make([]byte, 18)...),
		append([]byte{5, 1, 0, 5, 1, 0, 3, 4}, "echo\x00\x50"...),
		{5, 3, 2, 1, 0, 5, 1, 0, 1, 1, 2, 3, 4, 0, 80},
		{5, 0, 0}, {5, 1, 2}, {4, 1, 0, 80}, {5, 1, 0, 5, 2, 0, 1}, {5, 1, 0, 5, 1, 0, 9},
		{5, 255, 0},
	} {
		f.Add(seed)
	}
	p := &Proxy{lifetime: context.Background()} // no DNS proxy: domains are refused
	f.Fuzz(func(t *testing.T, in []byte) {
		const trailer = "PAYLOAD"
		c := &bytesConn{in: bytes.NewReader(append(append([]byte(nil), in...), trailer...))}
		dst, _, err := p.socksHandshake(c)
		if out := c.out.Bytes(); len(out) > 2 {
			t.Fatalf("handshake wrote %x, more than the method reply", out)
		}
		if err != nil {
			return
		}
		if !dst.IsValid() {
			t.Fatal("accepted with an invalid target")
		}
		// It consumed exactly the greeting and the request, as RFC 1928
		// frames them, and nothing after.
		all := append(append([]byte(nil), in...), trailer...)
		if used, want := len(all)-c.in.Len(), socksFrameLen(all); used != want {
			t.Fatalf("read %d bytes of %x, want the %d bytes of the greeting and the request", used, all, want)
		}
	})
}

// socksFrameLen is the length of the greeting and the request at the start
// of b (which holds at least both), read independently of socksHandshake.
func socksFrameLen(b []byte) int {
	greeting := 2 + int(b[1])
	req := b[greeting:]
	switch req[3] {
	case socksAtypIPv4:
		return greeting + 4 + 4 + 2
	case socksAtypIPv6:
		return greeting + 4 + 16 + 2
	}
	return greeting + 4 + 1 + int(req[4]) + 2
}
