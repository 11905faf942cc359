// Command echo is the e2e suite's test app, a TCP server and client in one
// static binary:
//
//	echo serve [-addr :8080]           answer each connection with one line
//	                                   "peer=IP:PORT" (the source it saw), then
//	                                   echo everything back until the client
//	                                   half-closes
//	echo dial [-hold D] ADDR [MESSAGE] connect, send MESSAGE, (wait D, the
//	                                   connection open,) half-close, and
//	                                   print what came back
//	echo dial -every I -for D [-hold H] ADDR [MESSAGE]
//	                                   open a new connection every I for D,
//	                                   each sending MESSAGE-SEQ and checking
//	                                   its echo (loop.go); print one summary
//	                                   line, then each failure, and exit 1
//	                                   if any failed
//	echo lookup NAME                   resolve NAME through the pod's
//	                                   resolv.conf, print "addrs=A,B"
//
// Its image is localhost/gozt-e2e/echo:dev in the e2e cluster.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: echo serve [-addr :8080] | echo dial [-every I -for D] [-hold D] ADDR [MESSAGE] | echo lookup NAME")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "dial":
		err = dial(os.Args[2:], os.Stdout)
	case "lookup":
		err = lookup(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", ":8080", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	log.Printf("listening on %v", ln.Addr())
	return serveOn(ln)
}

// serveOn answers every connection ln accepts, each on its own goroutine,
// until ln is closed.
func serveOn(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c)
	}
}

func handle(c net.Conn) {
	defer c.Close()
	log.Printf("connection from %v", c.RemoteAddr())
	if _, err := fmt.Fprintf(c, "peer=%v\n", c.RemoteAddr()); err != nil {
		return
	}
	if _, err := io.Copy(c, c); err != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// dialTimeout bounds each connect; ioTimeout bounds each connection's
// exchange, on top of its -hold.
const (
	dialTimeout = 5 * time.Second
	ioTimeout   = 10 * time.Second
)

// dial runs `echo dial` with args, writing what it prints to stdout.
func dial(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dial", flag.ContinueOnError)
	hold := fs.Duration("hold", 0, "how long to keep the connection open before half-closing")
	every := fs.Duration("every", 0, "open a new connection this often (with -for)")
	dur := fs.Duration("for", 0, "how long to keep opening connections (with -every)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	if len(args) < 1 {
		return errors.New("dial: want ADDR")
	}
	msg := "hello"
	if len(args) > 1 {
		msg = args[1]
	}
	if *every != 0 || *dur != 0 {
		if *every <= 0 || *dur <= 0 {
			return errors.New("dial: -every and -for go together, each a positive duration")
		}
		return loop{addr: args[0], msg: msg, every: *every, dur: *dur, hold: *hold}.run(stdout)
	}
	c, err := net.DialTimeout("tcp", args[0], dialTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(*hold + ioTimeout))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	time.Sleep(*hold)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	_, err = io.Copy(stdout, c)
	return err
}
