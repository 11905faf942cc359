//lint:file-ignore SA1019 x/net's http2.Server and http2.Transport (deprecated in favour of net/http) are deliberately the peer measured: the Go HBONE most users would write (issue 5).

package bench

import (
	"context"
	"crypto/tls"
	"flag"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/gozt/gozt/certs"
)

// The x/net pair is the HBONE proxy most Go users would write: an
// http2.Transport sending CONNECT requests (outbound) to an http2.Server
// whose handler dials the target (inbound), over mutual TLS with the same
// certificates as gozt, with ztunnel's HTTP/2 settings where x/net lets
// them be set (SPEC §2.2): 4 MiB stream and 16 MiB connection receive
// windows on the server, 1 MiB frames, 100 streams per connection. The
// standalone http2.Transport offers no knob for its receive windows; its
// defaults are a 4 MiB stream window (as ztunnel) and a 1 GiB connection
// window (more generous than ztunnel's 16 MiB).
const (
	xnetStreamWindow = 4 << 20
	xnetConnWindow   = 16 << 20
	xnetFrameSize    = 1 << 20
	xnetMaxStreams   = 100
)

// xnetOutRole is the outbound half: SOCKS5 in, CONNECT out.
type xnetOutRole struct {
	noCommands
	srv      connServer
	tr       *http2.Transport
	upstream string
	listen   string
}

func startXnetOut(ctx context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("xnet-out", flag.ContinueOnError)
	listen := fs.String("listen", "", "SOCKS5 `ADDR`")
	upstream := fs.String("upstream", "", "`ADDR` of the x/net inbound proxy")
	caDir := fs.String("ca-dir", "", "CA directory")
	id := fs.String("identity", "", "SPIFFE identity of this proxy's workload")
	peer := fs.String("peer", "", "SPIFFE identity expected of the inbound proxy")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	cert, err := issue(ctx, *caDir, *id)
	if err != nil {
		return nil, err
	}
	tlsCfg := certs.ClientConfig(cert, []string{*peer})
	tr := &http2.Transport{
		MaxReadFrameSize: xnetFrameSize,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		},
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return nil, err
	}
	x := &xnetOutRole{tr: tr, upstream: *upstream, listen: l.Addr().String()}
	x.srv.serve(l, x.handle)
	return x, nil
}

func (x *xnetOutRole) info() map[string]string { return map[string]string{"listen": x.listen} }

func (x *xnetOutRole) close() error {
	x.srv.close()
	x.tr.CloseIdleConnections()
	return nil
}

func (x *xnetOutRole) stats(m map[string]any) { m["conns"] = x.srv.count() }

// handle proxies one SOCKS5 connection through a CONNECT stream.
func (x *xnetOutRole) handle(c net.Conn) {
	down := c.(*net.TCPConn)
	dst, err := socksAccept(down)
	if err != nil {
		return
	}
	body := &downstreamBody{c: down, closed: make(chan struct{})}
	req := &http.Request{
		Method:        http.MethodConnect,
		URL:           &url.URL{Scheme: "https", Host: x.upstream},
		Host:          dst.String(),
		Header:        make(http.Header),
		Body:          body,
		ContentLength: -1,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := x.tr.RoundTrip(req.WithContext(ctx))
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	io.Copy(down, resp.Body)
	down.CloseWrite()
	// Keep the stream until the transport has sent the client's EOF.
	select {
	case <-body.closed:
	case <-time.After(time.Minute):
	}
}

// downstreamBody is the request body: the downstream connection's bytes,
// read directly by the transport (no pipe in between).
type downstreamBody struct {
	c      *net.TCPConn
	once   sync.Once
	closed chan struct{}
}

func (b *downstreamBody) Read(p []byte) (int, error) { return b.c.Read(p) }

func (b *downstreamBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}

// xnetInRole is the inbound half: an http2.Server on mutual TLS whose
// handler dials the CONNECT authority.
type xnetInRole struct {
	noCommands
	srv    connServer
	h2     *http2.Server
	listen string
	ctx    context.Context
	cancel context.CancelFunc
}

func startXnetIn(ctx context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("xnet-in", flag.ContinueOnError)
	listen := fs.String("listen", "", "HBONE `ADDR`")
	caDir := fs.String("ca-dir", "", "CA directory")
	id := fs.String("identity", "", "SPIFFE identity of this proxy's workload")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	cert, err := issue(ctx, *caDir, *id)
	if err != nil {
		return nil, err
	}
	tlsCfg := certs.ServerConfig(func(context.Context) (*certs.Cert, error) { return cert, nil })
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return nil, err
	}
	x := &xnetInRole{
		h2: &http2.Server{
			MaxReadFrameSize:             xnetFrameSize,
			MaxUploadBufferPerConnection: xnetConnWindow,
			MaxUploadBufferPerStream:     xnetStreamWindow,
			MaxConcurrentStreams:         xnetMaxStreams,
		},
		listen: l.Addr().String(),
	}
	x.ctx, x.cancel = context.WithCancel(context.Background())
	x.srv.serve(tls.NewListener(l, tlsCfg), x.serveConn)
	return x, nil
}

func (x *xnetInRole) info() map[string]string { return map[string]string{"listen": x.listen} }

func (x *xnetInRole) close() error {
	x.cancel()
	x.srv.close()
	return nil
}

func (x *xnetInRole) serveConn(c net.Conn) {
	tc := c.(*tls.Conn)
	hctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return
	}
	x.h2.ServeConn(tc, &http2.ServeConnOpts{Context: x.ctx, Handler: http.HandlerFunc(x.serveHTTP)})
}

// serveHTTP tunnels one CONNECT stream. x/net's server resets a stream
// whose handler returned while the client still sends, so the handler
// stays until both directions have ended.
func (x *xnetInRole) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	c, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	up := c.(*net.TCPConn)
	defer up.Close()
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(up, r.Body)
		up.CloseWrite()
	}()
	io.Copy(flushWriter{w, rc}, up)
	wg.Wait()
}

// flushWriter sends every write at once, as a tunnel must.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}
