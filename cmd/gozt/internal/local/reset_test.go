package local

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestResetCrossesTheTunnel (issue 14 defect 5, TESTPLAN F11, F15): a TCP
// reset on either end reaches the other end as a reset, not as an orderly
// FIN: the far proxy gets RST_STREAM CONNECT_ERROR and resets its leg.
func TestResetCrossesTheTunnel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resetBy string // "server" (the destination application) or "client"
	}{
		{name: "destination resets", resetBy: "server"},
		{name: "client aborts", resetBy: "client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := startMesh(t)
			ln, err := net.Listen("tcp", tm.ips.Server+":8080")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan *net.TCPConn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- c.(*net.TCPConn)
			}()
			client := socks5TCP(t, tm.ips.Client+":15080", tm.ips.Server+":8080")
			defer client.Close()
			if _, err := client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			var server *net.TCPConn
			select {
			case server = <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("the destination accepted nothing")
			}
			defer server.Close()
			buf := make([]byte, 4)
			if _, err := io.ReadFull(server, buf); err != nil {
				t.Fatal(err)
			}
			if _, err := server.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(client, buf); err != nil {
				t.Fatal(err)
			}

			resetter, victim := server, client
			if tc.resetBy == "client" {
				resetter, victim = client, server
			}
			if err := resetter.SetLinger(0); err != nil {
				t.Fatal(err)
			}
			resetter.Close()
			victim.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := victim.Read(buf)
			if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the other end read %d bytes, %v; want a reset (ECONNRESET), not EOF", n, err)
			}
		})
	}
}

// socks5TCP opens a SOCKS5 CONNECT to target (an IPv4 address) through
// proxy and returns the bare socket, so that the test can reset it.
func socks5TCP(t *testing.T, proxy, target string) *net.TCPConn {
	t.Helper()
	c, err := socks5Dial(proxy, target)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// socks5Dial is socks5TCP for any goroutine.
func socks5Dial(proxy, target string) (*net.TCPConn, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("SOCKS5 target %q: want an IPv4 address and port", target)
	}
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	tcp := c.(*net.TCPConn)
	ip := ap.Addr().As4()
	req := []byte{5, 1, 0, 5, 1, 0, 1, ip[0], ip[1], ip[2], ip[3], byte(ap.Port() >> 8), byte(ap.Port())}
	if _, err := tcp.Write(req); err != nil {
		tcp.Close()
		return nil, err
	}
	reply := make([]byte, 2+10)
	tcp.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(tcp, reply); err != nil {
		tcp.Close()
		return nil, fmt.Errorf("SOCKS5 handshake: %w", err)
	}
	tcp.SetReadDeadline(time.Time{})
	if reply[0] != 5 || reply[1] != 0 || reply[2] != 5 || reply[3] != 0 {
		tcp.Close()
		return nil, fmt.Errorf("SOCKS5 replies % x", reply)
	}
	return tcp, nil
}
