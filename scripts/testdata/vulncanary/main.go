// Command vulncanary is what scripts/vulncheck.sh scans first, to prove that
// its vulnerability database reports something: it serves HTTP/2 with
// golang.org/x/net v0.22.0, which is open to the CONTINUATION flood
// (GO-2024-2687, CVE-2023-45288; TESTPLAN 5.5). If govulncheck does not
// report that, the database or the scan is broken, and a clean scan of
// gozt would prove nothing.
package main

import (
	"net"

	"golang.org/x/net/http2"
)

func main() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	c, err := l.Accept()
	if err != nil {
		panic(err)
	}
	new(http2.Server).ServeConn(c, &http2.ServeConnOpts{})
}
