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
		fmt.Fprintln(os.Stderr, "usage: echo serve [-addr :8080] | echo dial [-hold D] ADDR [MESSAGE]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "dial":
		err = dial(os.Args[2:])
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

func dial(args []string) error {
	fs := flag.NewFlagSet("dial", flag.ContinueOnError)
	hold := fs.Duration("hold", 0, "how long to keep the connection open before half-closing")
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
	c, err := net.DialTimeout("tcp", args[0], 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(*hold + 10*time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	time.Sleep(*hold)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	_, err = io.Copy(os.Stdout, c)
	return err
}
