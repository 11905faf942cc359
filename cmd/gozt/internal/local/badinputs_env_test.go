package local

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/hbone/hbonetest"
	"github.com/gozt/gozt/rbac"
)

// The environment of TestBadInputs: one gozt local mesh on 127.87.N.0/24
// with its CA in a directory (so the test can sign deliberately broken
// certificates with the mesh's own CA key), backends on the server
// workload's IP that count what reaches them, and the canary.

var nextBadNet atomic.Int32

// Ports of the backends on the server workload's IP.
const (
	badEchoPort   = "9090" // echo: canaries and follow-up requests
	badTargetPort = "8080" // sink: what bad requests name; counts dials
	badDeniedPort = "8081" // sink behind a DENY policy (item 23)
	badFirePort   = "8082" // firehose: writes until the stream blocks (item 20)
)

type badEnv struct {
	tm     *testMesh
	caCert *x509.Certificate // the mesh CA's signing (root) certificate
	caKey  crypto.Signer
	ext    string // an HBONE workload added after start: no gozt serves it, fakeDest may
	victim string // another such workload (item 34)

	echo, target, denied, fire, mismatch, loopback *badSink
}

func startBadEnv(t *testing.T) *badEnv {
	t.Helper()
	n := nextBadNet.Add(1)
	ips := meshIPsIn(87, int(n))
	vip := fmt.Sprintf("127.87.%d.10", n)
	caDir := filepath.Join(t.TempDir(), "ca")
	e := &badEnv{
		tm:     startMeshOn(t, ips, vip, "", Options{CADir: caDir}),
		ext:    fmt.Sprintf("127.87.%d.5", n),
		victim: fmt.Sprintf("127.87.%d.6", n),
	}
	e.caCert, e.caKey = badReadCADir(t, caDir)
	srv := func(port string) string { return net.JoinHostPort(ips.Server, port) }
	e.echo = listenBadSink(t, srv(badEchoPort), badSinkEcho)
	e.target = listenBadSink(t, srv(badTargetPort), badSinkDiscard)
	e.denied = listenBadSink(t, srv(badDeniedPort), badSinkDiscard)
	e.fire = listenBadSink(t, srv(badFirePort), badSinkFire)
	e.mismatch = listenBadSink(t, net.JoinHostPort(ips.Client, badTargetPort), badSinkDiscard)
	e.loopback = listenBadSink(t, "127.0.0.1:0", badSinkDiscard)
	setPolicy(t, e.tm.Store(), &rbac.Policy{
		Name: "deny-client-8081", Namespace: "demo", Scope: rbac.Namespace, Action: rbac.Deny,
		Rules: []rbac.Rule{{Clauses: []rbac.Clause{
			{Matches: []rbac.Match{{Principals: []rbac.StringMatch{{Kind: rbac.Exact, Value: "cluster.local/ns/demo/sa/client"}}}}},
			{Matches: []rbac.Match{{DestinationPorts: []uint16{8081}}}},
		}}},
	}, false)
	return e
}

// badReadCADir reads back the root and key that localca created in dir.
func badReadCADir(t *testing.T, dir string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatal("CA files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key.(crypto.Signer)
}

func (e *badEnv) server(port string) string { return net.JoinHostPort(e.tm.ips.Server, port) }

// peer opens a frame-level client from the client workload's IP to the
// server's 15008 with the client's mesh certificate, preface sent.
func (e *badEnv) peer(t *testing.T) *hbonetest.Peer {
	t.Helper()
	p := dialH2Peer(t, e.tm.ips.Client, e.server("15008"), e.tm.clientTLS(t))
	p.Handshake()
	return p
}

// followUp checks that the connection still serves a tunnel.
func (e *badEnv) followUp(t testing.TB, p *hbonetest.Peer, id uint32) {
	t.Helper()
	p.Connect(id, e.server(badEchoPort))
	p.WantStatus(id, "200")
	p.Echo(id, []byte("still serving"))
}

// badSinkMode is what a sink does with an accepted connection.
type badSinkMode int

const (
	badSinkDiscard badSinkMode = iota // read to EOF
	badSinkEcho                       // echo to EOF, then half-close
	badSinkFire                       // write seeded bytes until the write fails
)

// badSink is a TCP backend that counts accepted connections, open
// connections and bytes read (or, for sinkFire, written).
type badSink struct {
	ln      net.Listener
	accepts atomic.Int64
	open    atomic.Int64
	bytes   atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	sources []string
}

func listenBadSink(t *testing.T, addr string, mode badSinkMode) *badSink {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &badSink{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop(mode)
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *badSink) acceptLoop(mode badSinkMode) {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepts.Add(1)
		s.open.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.sources = append(s.sources, c.RemoteAddr().String())
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c, mode)
	}
}

func (s *badSink) serve(c net.Conn, mode badSinkMode) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.open.Add(-1)
	}()
	switch mode {
	case badSinkDiscard:
		n, _ := io.Copy(io.Discard, c)
		s.bytes.Add(n)
	case badSinkEcho:
		n, _ := io.Copy(c, c)
		s.bytes.Add(n)
		c.(*net.TCPConn).CloseWrite()
	case badSinkFire:
		c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		src := prng(20, 1<<40)
		buf := make([]byte, 16<<10)
		for {
			io.ReadFull(src, buf)
			n, err := c.Write(buf)
			s.bytes.Add(int64(n))
			if err != nil {
				return
			}
		}
	}
}

func (s *badSink) lastSource() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sources) == 0 {
		return ""
	}
	return s.sources[len(s.sources)-1]
}

// badWaitFor polls cond until it holds, failing after d. It waits for an
// outcome; it does not assert how long the outcome took.
func badWaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// badWaitClosed waits for ch to be closed, failing after 20 s (the test's
// cleanup then unblocks whatever hangs).
func badWaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not within 20 s", what)
	}
}

// badCanary is one healthy HBONE connection through the gozt under test: its
// own TLS connection from the client workload's IP to the server's 15008,
// one CONNECT tunnel to the echo backend, a writer streaming seeded bytes
// in paced chunks and a reader checking every echoed byte as it arrives.
type badCanary struct {
	cc          *hbone.ClientConn
	s           *hbone.ClientStream
	stop        chan struct{}
	wrote, read atomic.Int64
	// wdone and rdone are closed when the writer and the reader end, after
	// they set werr and rerr.
	wdone, rdone chan struct{}
	werr, rerr   error
}

// badCanaryStats is what check reports about a canary.
type badCanaryStats struct {
	bytes int64 // echoed intact, in total
}

func (e *badEnv) startCanary(t *testing.T, seed uint64) *badCanary {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(e.tm.ips.Client)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", e.server("15008"))
	if err != nil {
		t.Fatalf("canary: dial: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := hbone.NewClientConn(ctx, tls.Client(raw, e.tm.clientTLS(t)), hbone.Config{})
	if err != nil {
		raw.Close()
		t.Fatalf("canary: %v", err)
	}
	s, err := cc.Connect(ctx, e.server(badEchoPort), nil)
	if err != nil {
		cc.Close()
		t.Fatalf("canary: CONNECT: %v", err)
	}
	c := &badCanary{cc: cc, s: s, stop: make(chan struct{}), wdone: make(chan struct{}), rdone: make(chan struct{})}
	go c.writeLoop(seed)
	go c.readLoop(seed)
	t.Cleanup(func() { // after check, or when the case failed first
		s.Close()
		cc.Close()
		<-c.wdone
		<-c.rdone
	})
	return c
}

// writeLoop writes seed's stream in 8 KiB chunks, about 1 ms apart (a
// steady flow, not a benchmark on a shared machine), until stop.
func (c *badCanary) writeLoop(seed uint64) {
	src := prng(seed, 1<<40)
	buf := make([]byte, 8<<10)
	for {
		select {
		case <-c.stop:
			c.endWrite(c.s.CloseWrite())
			return
		default:
		}
		io.ReadFull(src, buf)
		n, err := c.s.Write(buf)
		c.wrote.Add(int64(n))
		if err != nil {
			c.endWrite(fmt.Errorf("write after %d bytes: %w", c.wrote.Load(), err))
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *badCanary) endWrite(err error) {
	c.werr = err
	close(c.wdone)
}

func (c *badCanary) endRead(err error) {
	c.rerr = err
	close(c.rdone)
}

// readLoop checks the echo against seed's stream until EOF.
func (c *badCanary) readLoop(seed uint64) {
	want := prng(seed, 1<<40)
	got := make([]byte, 32<<10)
	exp := make([]byte, 32<<10)
	for {
		n, err := c.s.Read(got)
		if n > 0 {
			io.ReadFull(want, exp[:n])
			if !bytes.Equal(got[:n], exp[:n]) {
				c.endRead(fmt.Errorf("corrupt echo in [%d, %d)", c.read.Load(), c.read.Load()+int64(n)))
				return
			}
			c.read.Add(int64(n))
		}
		if errors.Is(err, io.EOF) {
			c.endRead(nil)
			return
		}
		if err != nil {
			c.endRead(fmt.Errorf("read after %d bytes: %w", c.read.Load(), err))
			return
		}
	}
}

// check asserts that the canary's connection is still open, that more
// bytes come back after the case (a liveness floor, not a rate), and that
// after a clean half-close every byte written came back intact and nothing
// more.
func (c *badCanary) check(t *testing.T) badCanaryStats {
	t.Helper()
	select {
	case <-c.cc.Done():
		t.Fatalf("canary: its HBONE connection closed during the case")
	case <-c.wdone:
		t.Fatalf("canary: writer failed during the case: %v", c.werr)
	case <-c.rdone:
		t.Fatalf("canary: reader failed during the case: %v", c.rerr)
	default:
	}
	r0 := c.read.Load()
	badWaitFor(t, 20*time.Second, "canary: 64 KiB more echoed after the case", func() bool { return c.read.Load() >= r0+64<<10 })
	close(c.stop)
	badWaitClosed(t, c.wdone, "canary: writer half-closed")
	if c.werr != nil {
		t.Fatalf("canary: writer: %v", c.werr)
	}
	badWaitClosed(t, c.rdone, "canary: reader at EOF")
	if c.rerr != nil {
		t.Fatalf("canary: reader: %v", c.rerr)
	}
	if w, r := c.wrote.Load(), c.read.Load(); w != r {
		t.Fatalf("canary: wrote %d bytes, %d came back", w, r)
	}
	select {
	case <-c.cc.Done():
		t.Fatalf("canary: HBONE connection closed")
	default:
	}
	return badCanaryStats{bytes: c.read.Load()}
}

// tlsAttempt connects to the server's 15008 from the client's IP with cfg
// and reports nil if the server accepted (it sent its HTTP/2 SETTINGS),
// otherwise the error the client saw. With TLS 1.3 the server's verdict on
// a client certificate arrives after the client's handshake completes, so
// a refusal shows on the first read.
func (e *badEnv) tlsAttempt(t *testing.T, cfg *tls.Config) error {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(e.tm.ips.Client)}, Timeout: 5 * time.Second}
	raw, err := d.Dial("tcp", e.server("15008"))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer raw.Close()
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(15 * time.Second))
	if err := tc.Handshake(); err != nil {
		return err
	}
	if _, err := tc.Write([]byte(badPreface)); err != nil {
		return err
	}
	n, err := tc.Read(make([]byte, 1))
	if n > 0 {
		return nil
	}
	if err == nil {
		err = errors.New("read nothing")
	}
	return err
}

const badPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// badClientTLS is a client config presenting chain (DER, leaf first) with
// key, doing no verification of its own: the server's verdict is the test.
func badClientTLS(chain [][]byte, key crypto.Signer) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, InsecureSkipVerify: true}
	if chain != nil {
		cfg.Certificates = []tls.Certificate{{Certificate: chain, PrivateKey: key}}
	}
	return cfg
}

// badMint signs tmpl for a fresh P-256 key with parent/parentKey (a nil
// parent self-signs), filling the serial number and a validity of now±1h
// where unset, and returns the DER (not parsed back: some are meant to be
// unparseable) and the key.
func badMint(t *testing.T, tmpl, parent *x509.Certificate, parentKey crypto.Signer) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := *tmpl
	if c.SerialNumber == nil {
		c.SerialNumber, _ = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	}
	if c.NotBefore.IsZero() {
		c.NotBefore = time.Now().Add(-time.Hour)
	}
	if c.NotAfter.IsZero() {
		c.NotAfter = time.Now().Add(time.Hour)
	}
	if parent == nil {
		parent, parentKey = &c, key
	}
	der, err := x509.CreateCertificate(rand.Reader, &c, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatalf("mint %v: %v", c.Subject, err)
	}
	return der, key
}

// badCATemplate is an intermediate CA template named name.
func badCATemplate(name string) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

func badParseCert(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// badFakeDest is a TLS listener on a mesh workload's 15008 that gozt does not
// serve (the workload was added after start), for the outbound cases.
type badFakeDest struct {
	ln         net.Listener
	accepts    atomic.Int64 // TCP connections
	handshakes atomic.Int64 // completed TLS handshakes
	hsErrs     atomic.Int64 // failed TLS handshakes
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      []net.Conn
}

// listenBadFakeDest serves TLS with cert on addr and hands the n-th (from 1)
// completed connection to serve.
func listenBadFakeDest(t *testing.T, addr string, cert *certs.Cert, serve func(n int64, c net.Conn)) *badFakeDest {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f := &badFakeDest{ln: ln}
	cfg := certs.ServerConfig(func(context.Context) (*certs.Cert, error) { return cert, nil })
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepts.Add(1)
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				tc := tls.Server(c, cfg)
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := tc.Handshake(); err != nil {
					f.hsErrs.Add(1)
					return
				}
				tc.SetDeadline(time.Time{})
				serve(f.handshakes.Add(1), tc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}
