package relay_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/relay"
)

// testTimeout bounds every blocking step of a test, so a relay bug fails the
// test instead of hanging it.
const testTimeout = 60 * time.Second

// tcpConnPair returns both ends of a fresh loopback TCP connection.
func tcpConnPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	type acceptResult struct {
		c   *net.TCPConn
		err error
	}
	ch := make(chan acceptResult, 1)
	go func() {
		c, err := ln.AcceptTCP()
		ch <- acceptResult{c, err}
	}()
	d, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	return d, r.c
}

// legKind says how a relay leg is presented to relay.Copy.
type legKind int

const (
	legTCP    legKind = iota // the *net.TCPConn itself: splice path
	legOpaque                // a wrapper hiding the TCPConn: buffered path
	legChaos                 // chaosConn: buffered path with short reads/writes and delays
	legTLS                   // TLS over the TCPConn
	legPush                  // pushConn: a source that pushes, like an HBONE stream
)

func (k legKind) String() string {
	return [...]string{"tcp", "opaque", "chaos", "tls", "push"}[k]
}

// relayed is client ⇄ [a relay b] ⇄ server over loopback TCP, with the relay
// running in a goroutine. client and server are the application ends; for
// legTLS they are TLS conns.
type relayed struct {
	client, server net.Conn
	clientTCP      *net.TCPConn // the socket under client
	serverTCP      *net.TCPConn // the socket under server
	a, b           net.Conn     // the relay legs as given to relay.Copy
	aToB, bToA     atomic.Int64
	poller         *relay.Poller // with viaPoller; nil otherwise (CloseConn then just closes)

	done   chan copyOutcome
	once   sync.Once
	result copyOutcome
}

type copyOutcome struct {
	res relay.Result
	err error
}

// startRelay builds the topology and starts relay.CopyWithCounters(a, b). The
// cleanup closes every conn and waits for the copy, so no goroutine outlives
// the test.
func startRelay(t testing.TB, ka, kb legKind) *relayed {
	return startRelayVia(t, ka, kb, viaCopy)
}

// via says which entry point runs a test relay.
type via int

const (
	viaCopy   via = iota // relay.CopyWithCounters on a goroutine of the test
	viaStart             // relay.Start
	viaPoller            // relay.Poller.Start: idle waits parked in a Poller
)

func (v via) String() string { return [...]string{"copy", "start", "poller"}[v] }

// startRelayVia is startRelay with the entry point chosen.
func startRelayVia(t testing.TB, ka, kb legKind, v via) *relayed {
	t.Helper()
	r := &relayed{done: make(chan copyOutcome, 1)}
	var aTCP, bTCP *net.TCPConn
	r.clientTCP, aTCP = tcpConnPair(t)
	bTCP, r.serverTCP = tcpConnPair(t)
	r.client, r.a = makeLegs(t, r.clientTCP, aTCP, ka, false, 1)
	r.server, r.b = makeLegs(t, bTCP, r.serverTCP, kb, true, 2)
	switch v {
	case viaStart:
		relay.Start(r.a, r.b, &r.aToB, &r.bToA, func(res relay.Result, err error) {
			r.done <- copyOutcome{res, err}
		})
	case viaPoller:
		r.poller = relay.NewPoller(nil)
		r.poller.Start(r.a, r.b, &r.aToB, &r.bToA, func(res relay.Result, err error) {
			r.done <- copyOutcome{res, err}
		})
	default:
		go func() {
			res, err := relay.CopyWithCounters(r.a, r.b, &r.aToB, &r.bToA)
			r.done <- copyOutcome{res, err}
		}()
	}
	t.Cleanup(func() {
		for _, c := range []net.Conn{r.client, r.server} {
			c.Close()
		}
		// A leg parked in the Poller is closed through it: a plain Close
		// would not end its copy (relay.Poller).
		r.poller.CloseConn(r.a)
		r.poller.CloseConn(r.b)
		r.wait(t)
		r.poller.Close()
	})
	return r
}

// makeLegs wraps the two ends of one TCP connection, one of which is a
// relay leg (legIsDialed says which), and returns (app end, relay leg). Only
// the relay leg gets the opaque or chaos wrapper; the application end stays
// a plain conn. For TLS the dialed end is the TLS client, and both
// handshakes finish before makeLegs returns.
func makeLegs(t testing.TB, dialed, accepted *net.TCPConn, k legKind, legIsDialed bool, seed uint64) (app, leg net.Conn) {
	t.Helper()
	var d, a net.Conn = dialed, accepted
	switch k {
	case legOpaque:
		if legIsDialed {
			d = wrapOpaque(dialed)
		} else {
			a = wrapOpaque(accepted)
		}
	case legChaos:
		if legIsDialed {
			d = newChaosConn(dialed, seed)
		} else {
			a = newChaosConn(accepted, seed)
		}
	case legTLS:
		d, a = tlsPair(t, dialed, accepted)
	case legPush:
		if legIsDialed {
			d = newPushConn(dialed, seed)
		} else {
			a = newPushConn(accepted, seed)
		}
	}
	if legIsDialed {
		return a, d
	}
	return d, a
}

// wait returns the outcome of the copy, failing the test if it does not end
// within testTimeout.
func (r *relayed) wait(t testing.TB) copyOutcome {
	t.Helper()
	r.once.Do(func() {
		select {
		case r.result = <-r.done:
		case <-time.After(testTimeout):
			t.Errorf("relay.Copy did not return within %v", testTimeout)
			// Unblock it so the test can end; the result is lost.
			r.poller.CloseConn(r.a)
			r.poller.CloseConn(r.b)
			r.result = <-r.done
		}
	})
	return r.result
}

// opaqueConn hides a *net.TCPConn from the relay but keeps CloseWrite.
type opaqueConn struct {
	net.Conn
	tcp *net.TCPConn
}

func wrapOpaque(c *net.TCPConn) net.Conn { return &opaqueConn{Conn: c, tcp: c} }

func (c *opaqueConn) CloseWrite() error { return c.tcp.CloseWrite() }

// chaosConn wraps a TCP conn with random short reads, short writes that
// report no error, and short random delays: TESTPLAN's "copystress" for the
// buffered path. Read and Write each have their own PRNG, because the relay
// reads and writes a conn from different goroutines.
type chaosConn struct {
	net.Conn
	tcp        *net.TCPConn
	rrng, wrng *mrand.Rand
}

func newChaosConn(c *net.TCPConn, seed uint64) *chaosConn {
	return &chaosConn{
		Conn: c,
		tcp:  c,
		rrng: mrand.New(mrand.NewPCG(seed, 1)),
		wrng: mrand.New(mrand.NewPCG(seed, 2)),
	}
}

func (c *chaosConn) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1+c.rrng.IntN(len(p))]
	}
	chaosDelay(c.rrng)
	return c.Conn.Read(p)
}

// Write writes a random prefix of p and reports only that, with no error:
// a short write the relay must continue.
func (c *chaosConn) Write(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1+c.wrng.IntN(len(p))]
	}
	chaosDelay(c.wrng)
	return c.Conn.Write(p)
}

func (c *chaosConn) CloseWrite() error { return c.tcp.CloseWrite() }

func chaosDelay(r *mrand.Rand) {
	if r.IntN(64) == 0 {
		time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
	}
}

// pushConn is a relay leg that pushes its bytes the way an HBONE stream does
// (hbone's PushTo): once the relay calls PushTo, a goroutine of its own reads
// the socket in random pieces and offers each to the destination's TryWrite
// (most of the time) and what that did not take to Write, then reports the
// end through done. Before PushTo it is a plain conn (Read works), so when
// the relay cannot use the push it falls back to reading it.
type pushConn struct {
	net.Conn
	tcp    *net.TCPConn
	rng    *mrand.Rand
	pushed atomic.Bool
	tries  atomic.Int64 // TryWrite calls
	writes atomic.Int64 // Write calls

	// shut is set as CloseWrite starts, so that an EOF read after our own
	// shutdown (the socket may then be CLOSED) is not taken for a reset.
	shut atomic.Bool
}

func newPushConn(c *net.TCPConn, seed uint64) *pushConn {
	return &pushConn{Conn: c, tcp: c, rng: mrand.New(mrand.NewPCG(seed, 3))}
}

func (c *pushConn) CloseWrite() error {
	c.shut.Store(true)
	return c.tcp.CloseWrite()
}

// errPushReset is what a pushConn reports when its socket was reset but its
// read saw EOF: an HBONE stream reports a peer's reset to its reader however
// its writes went.
var errPushReset = fmt.Errorf("push: EOF on a reset socket: %w", syscall.ECONNRESET)

func (c *pushConn) PushTo(w io.Writer, done func(error)) error {
	tw, ok := w.(interface{ TryWrite([]byte) (int, error) })
	if !ok {
		return fmt.Errorf("push destination %T has no TryWrite", w)
	}
	c.pushed.Store(true)
	go c.push(w, tw, done)
	return nil
}

func (c *pushConn) push(w io.Writer, tw interface{ TryWrite([]byte) (int, error) }, done func(error)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := c.tcp.Read(buf[:1+c.rng.IntN(len(buf))])
		p := buf[:n]
		if len(p) > 0 && c.rng.IntN(4) > 0 {
			k, werr := tw.TryWrite(p)
			c.tries.Add(1)
			if werr != nil {
				done(werr)
				return
			}
			p = p[k:]
		}
		if len(p) > 0 {
			c.writes.Add(1)
			if _, werr := w.Write(p); werr != nil {
				done(werr)
				return
			}
		}
		if err == io.EOF {
			// Linux reports a reset to one system call only, and the
			// relay's opposite direction writes to this socket: its
			// write may take the ECONNRESET and leave this read an EOF.
			// An HBONE stream, which this stands for, reports a reset
			// to its reader whatever its writes saw, so check the
			// socket like the relay checks a TCP source. shut is loaded
			// again after the look: if our own FIN closed the socket,
			// the shutdown began after shut was set.
			if !c.shut.Load() && relay.ResetAtEOF(c.tcp) && !c.shut.Load() {
				done(errPushReset)
				return
			}
			done(nil)
			return
		}
		if err != nil {
			done(err)
			return
		}
	}
}

// checkPushed fails the test unless every pushConn leg of r whose opposite
// leg is a *net.TCPConn was driven through PushTo: the relay must not fall
// back to reading it.
func checkPushed(t testing.TB, r *relayed) {
	t.Helper()
	for _, l := range []struct{ leg, other net.Conn }{{r.a, r.b}, {r.b, r.a}} {
		pc, ok := l.leg.(*pushConn)
		if _, tcp := l.other.(*net.TCPConn); !ok || !tcp || !relay.PushSupported {
			continue
		}
		if !pc.pushed.Load() {
			t.Errorf("push leg was not pushed")
		}
	}
}

// noCloseWriteConn hides CloseWrite (and the TCPConn) from the relay.
type noCloseWriteConn struct{ net.Conn }

// failingConn returns failErr from Read once it has read failAfter bytes.
type failingConn struct {
	net.Conn
	failAfter int
	read      int
	failErr   error
}

func (c *failingConn) Read(p []byte) (int, error) {
	if c.read >= c.failAfter {
		return 0, c.failErr
	}
	if len(p) > c.failAfter-c.read {
		p = p[:c.failAfter-c.read]
	}
	n, err := c.Conn.Read(p)
	c.read += n
	return n, err
}

// writeStream writes n bytes of the PRNG stream for seed to w, in random
// chunks of 1 B to 256 KiB.
func writeStream(w io.Writer, seed uint64, n int64) error {
	src := newStream(seed)
	sizes := mrand.New(mrand.NewPCG(seed, 99))
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := 1 + sizes.IntN(len(buf))
		if int64(k) > n {
			k = int(n)
		}
		src.Read(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= int64(k)
	}
	return nil
}

// readStream reads r to EOF and checks that it carried a prefix of the PRNG
// stream for seed; it returns how many bytes arrived. A byte that differs is
// an error naming its offset.
func readStream(r io.Reader, seed uint64) (int64, error) {
	want := newStream(seed)
	got := make([]byte, 64<<10)
	exp := make([]byte, len(got))
	var total int64
	for {
		n, err := r.Read(got)
		if n > 0 {
			want.Read(exp[:n])
			if !bytes.Equal(got[:n], exp[:n]) {
				for i := range n {
					if got[i] != exp[i] {
						return total + int64(i), fmt.Errorf("stream %d differs at byte %d", seed, total+int64(i))
					}
				}
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

func newStream(seed uint64) *mrand.ChaCha8 {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return mrand.NewChaCha8(s)
}

// tlsPair runs TLS over a TCP connection: the dialed end as client, the
// accepted end as server with a throwaway self-signed certificate.
func tlsPair(t testing.TB, dialed, accepted *net.TCPConn) (net.Conn, net.Conn) {
	t.Helper()
	cert := selfSigned(t)
	srv := tls.Server(accepted, &tls.Config{Certificates: []tls.Certificate{cert}})
	// The test checks bytes, not identities; the peer is on loopback.
	cli := tls.Client(dialed, &tls.Config{InsecureSkipVerify: true})
	errc := make(chan error, 1)
	go func() { errc <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatalf("tls client handshake: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("tls server handshake: %v", err)
	}
	return cli, srv
}

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "relay-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
