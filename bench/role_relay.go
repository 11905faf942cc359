package bench

import (
	"context"
	"flag"
	"io"
	"net"
	"sync"
	"time"
)

// relayRole is the plain Go splice relay: accept, dial a fixed target, and
// io.Copy both ways between the two *net.TCPConn (which the standard
// library turns into splice(2)), half-closing each direction at its EOF.
// It is the floor of any Go TCP proxy. With --socks it first takes the
// client's SOCKS5 greeting and request as the x/net pair's outbound does
// (socksAccept: two replies, success before the dial), so that a relay
// chain is addressed as the pairs are; it still dials --target, whatever
// the request names.
type relayRole struct {
	noCommands
	srv    connServer
	listen string
}

func startRelay(_ context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	listen := fs.String("listen", "", "`ADDR` to accept on")
	target := fs.String("target", "", "`ADDR` to relay to")
	socks := fs.Bool("socks", false, "take a SOCKS5 handshake from each client before relaying")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return nil, err
	}
	r := &relayRole{listen: l.Addr().String()}
	r.srv.serve(l, func(c net.Conn) {
		if *socks {
			if _, err := socksAccept(c); err != nil {
				return
			}
		}
		relayConn(c.(*net.TCPConn), *target)
	})
	return r, nil
}

func (r *relayRole) info() map[string]string { return map[string]string{"listen": r.listen} }
func (r *relayRole) close() error            { r.srv.close(); return nil }

func relayConn(down *net.TCPConn, target string) {
	c, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	up := c.(*net.TCPConn)
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(up, down)
		up.CloseWrite()
	}()
	io.Copy(down, up)
	down.CloseWrite()
	wg.Wait()
}
