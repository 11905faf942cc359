package relay_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/proxy/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop))
}

// streamSize is the payload each way in the integrity test: 64 MiB, enough
// to reach the largest buffer class and many splice chunks.
func streamSize(t *testing.T) int64 {
	if testing.Short() {
		return 12 << 20
	}
	return 64 << 20
}

// TestCopyIntegrity sends a seeded PRNG stream each way at once, written in
// random chunks, and checks each arrives byte for byte, ends with EOF exactly
// at its length, and is counted in the Result and the live counters
// (TESTPLAN "Payload integrity").
func TestCopyIntegrity(t *testing.T) {
	for _, tc := range []struct {
		a, b legKind
		v    via
	}{
		{legTCP, legTCP, viaCopy},
		{legChaos, legChaos, viaCopy},
		{legTCP, legChaos, viaCopy},
		{legTLS, legOpaque, viaCopy},
		{legTCP, legPush, viaCopy},
		{legPush, legTCP, viaCopy},
		{legPush, legPush, viaCopy}, // no TCP destination: read like any conn
		{legTCP, legPush, viaStart},
		{legChaos, legTCP, viaStart},
		{legTCP, legTCP, viaStart},
		{legTCP, legPush, viaPoller},
		{legPush, legTCP, viaPoller},
	} {
		name := tc.a.String() + "-" + tc.b.String()
		if tc.v != viaCopy {
			name += "/" + tc.v.String()
		}
		t.Run(name, func(t *testing.T) {
			n := streamSize(t)
			r := startRelayVia(t, tc.a, tc.b, tc.v)
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			send := func(w net.Conn, seed uint64) {
				defer wg.Done()
				if err := writeStream(w, seed, n); err != nil {
					errs <- fmt.Errorf("write stream %d: %w", seed, err)
					return
				}
				if err := w.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					errs <- fmt.Errorf("close write %d: %w", seed, err)
				}
			}
			recv := func(rd net.Conn, seed uint64) {
				defer wg.Done()
				got, err := readStream(rd, seed)
				if err == nil && got != n {
					err = fmt.Errorf("stream %d: got %d bytes, want %d", seed, got, n)
				}
				if err != nil {
					errs <- err
				}
			}
			wg.Add(4)
			go send(r.client, 1)
			go recv(r.server, 1)
			go send(r.server, 2)
			go recv(r.client, 2)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			out := r.wait(t)
			if out.err != nil {
				t.Errorf("Copy: %v", out.err)
			}
			want := relay.Result{AToB: n, BToA: n}
			if diff := cmp.Diff(want, out.res); diff != "" {
				t.Errorf("Copy result (-want +got):\n%s", diff)
			}
			if got := (relay.Result{AToB: r.aToB.Load(), BToA: r.bToA.Load()}); got != want {
				t.Errorf("live counters = %+v, want %+v", got, want)
			}
			checkPushed(t, r)
		})
	}
}

// TestCopyHalfClose checks that each direction ends on its own: one side
// closes its write half after N bytes, its peer sees EOF exactly at N, and
// only then the other side sends M bytes, which arrive whole before their
// EOF (TESTPLAN F13, F14). Copy then returns without closing its legs.
func TestCopyHalfClose(t *testing.T) {
	const n, m = 300_001, 5<<20 + 17
	for _, legs := range []struct {
		a, b legKind
		v    via
	}{
		{legTCP, legTCP, viaCopy}, {legChaos, legChaos, viaCopy}, {legTLS, legTLS, viaCopy},
		{legTCP, legPush, viaCopy}, {legPush, legTCP, viaCopy},
		{legTCP, legPush, viaStart}, {legPush, legTCP, viaStart}, {legTLS, legTLS, viaStart},
		{legTCP, legPush, viaPoller}, {legPush, legTCP, viaPoller},
	} {
		for _, clientFirst := range []bool{true, false} {
			name := fmt.Sprintf("%v-%v/via-%v/client-first=%v", legs.a, legs.b, legs.v, clientFirst)
			t.Run(name, func(t *testing.T) {
				r := startRelayVia(t, legs.a, legs.b, legs.v)
				first, second := r.client, r.server
				if !clientFirst {
					first, second = r.server, r.client
				}
				deadline(t, r.client, r.server)
				errc := make(chan error, 1)
				go func() {
					if err := writeStream(first, 10, n); err != nil {
						errc <- err
						return
					}
					errc <- first.(interface{ CloseWrite() error }).CloseWrite()
				}()
				got, err := readStream(second, 10)
				if err != nil || got != n {
					t.Fatalf("first direction: read %d bytes, err %v; want %d bytes then EOF", got, err, n)
				}
				if err := <-errc; err != nil {
					t.Fatalf("first direction writer: %v", err)
				}
				// The first direction is over; the second must still flow.
				go func() {
					if err := writeStream(second, 11, m); err != nil {
						errc <- err
						return
					}
					errc <- second.(interface{ CloseWrite() error }).CloseWrite()
				}()
				got, err = readStream(first, 11)
				if err != nil || got != m {
					t.Fatalf("second direction: read %d bytes, err %v; want %d bytes then EOF", got, err, m)
				}
				if err := <-errc; err != nil {
					t.Fatalf("second direction writer: %v", err)
				}
				out := r.wait(t)
				want := relay.Result{AToB: n, BToA: m}
				if !clientFirst {
					want = relay.Result{AToB: m, BToA: n}
				}
				if out.err != nil || out.res != want {
					t.Errorf("Copy = %+v, %v; want %+v, nil", out.res, out.err, want)
				}
				for name, c := range map[string]net.Conn{"a": r.a, "b": r.b} {
					if err := c.SetDeadline(time.Time{}); err != nil {
						t.Errorf("leg %s after a clean Copy: SetDeadline = %v; Copy must not close its legs", name, err)
					}
				}
				checkPushed(t, r)
			})
		}
	}
}

// TestCopyNoCloseWrite checks a destination without CloseWrite: after the
// source's EOF the destination stays open while the other direction flows,
// and is closed when that direction ends too.
func TestCopyNoCloseWrite(t *testing.T) {
	client, a := tcpConnPair(t)
	b, server := tcpConnPair(t)
	defer func() {
		for _, c := range []net.Conn{client, a, b, server} {
			c.Close()
		}
	}()
	deadline(t, client, server)
	done := make(chan copyOutcome, 1)
	go func() {
		res, err := relay.Copy(a, noCloseWriteConn{b})
		done <- copyOutcome{res, err}
	}()

	const n, m = 70_000, 1 << 20
	if err := writeStream(client, 20, n); err != nil {
		t.Fatal(err)
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, n)); err != nil {
		t.Fatalf("server read: %v", err)
	}
	// b cannot be half-closed, so the server must not see EOF yet.
	server.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if k, err := server.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("server read after client EOF = %d, %v; want a timeout (b stays open while b→a flows)", k, err)
	}
	server.SetReadDeadline(time.Now().Add(testTimeout))

	go func() {
		writeStream(server, 21, m)
		server.CloseWrite()
	}()
	if got, err := readStream(client, 21); err != nil || got != m {
		t.Fatalf("client read %d, %v; want %d then EOF", got, err, m)
	}
	var out copyOutcome
	select {
	case out = <-done:
	case <-time.After(testTimeout):
		t.Fatal("Copy did not return")
	}
	if want := (relay.Result{AToB: n, BToA: m}); out.err != nil || out.res != want {
		t.Errorf("Copy = %+v, %v; want %+v, nil", out.res, out.err, want)
	}
	// Now that both directions ended, b was closed: the server sees EOF.
	if k, err := server.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("server read after Copy = %d, %v; want EOF", k, err)
	}
}

// TestCopyReset resets one application end in the middle of a transfer: the
// copy must end promptly without an error, and the other application end must
// see a reset, not an orderly EOF (TESTPLAN F11, F15, F16).
func TestCopyReset(t *testing.T) {
	for _, legs := range []struct {
		a, b legKind
		v    via
	}{
		{legTCP, legTCP, viaCopy}, {legTLS, legTLS, viaCopy}, {legChaos, legChaos, viaCopy},
		{legTCP, legPush, viaCopy}, {legPush, legTCP, viaCopy},
		{legTCP, legPush, viaStart}, {legTCP, legTLS, viaStart},
		{legTCP, legPush, viaPoller}, {legPush, legTCP, viaPoller},
	} {
		for _, resetClient := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v-%v/via-%v/reset-client=%v", legs.a, legs.b, legs.v, resetClient), func(t *testing.T) {
				r := startRelayVia(t, legs.a, legs.b, legs.v)
				deadline(t, r.client, r.server)
				victimTCP, victim, survivor := r.clientTCP, r.client, r.server
				if !resetClient {
					victimTCP, victim, survivor = r.serverTCP, r.server, r.client
				}
				// The survivor streams towards the victim, which reads
				// 1 MiB and then resets its socket.
				writeErr := make(chan error, 1)
				go func() {
					writeErr <- writeStream(survivor, 30, 1<<40) // ends with an error after the reset
				}()
				if _, err := io.ReadFull(victim, make([]byte, 1<<20)); err != nil {
					t.Fatalf("victim read: %v", err)
				}
				victimTCP.SetLinger(0)
				victimTCP.Close()

				start := time.Now()
				out := r.wait(t)
				if out.err != nil {
					t.Errorf("Copy after a peer reset = %v, want nil (resets are not errors)", out.err)
				}
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("Copy took %v to end after the reset", d)
				}
				// Linux reports a reset to the first read or write that
				// follows it, so the survivor's reader or writer sees it.
				_, rerr := io.Copy(io.Discard, survivor)
				survivor.Close()
				werr := <-writeErr
				reset := errors.Is(rerr, syscall.ECONNRESET) || errors.Is(werr, syscall.ECONNRESET)
				survivorLeg := legs.b
				if !resetClient {
					survivorLeg = legs.a
				}
				if (survivorLeg == legTCP || survivorLeg == legTLS) && !reset {
					// (A wrapper that is neither TCP nor TLS is just
					// closed: for chaos and push legs any end but a
					// hang will do.)
					t.Errorf("survivor read error %v, write error %v; want ECONNRESET from one", rerr, werr)
				}
			})
		}
	}
}

// TestCopyError checks that a real failure (not a reset or close) ends both
// directions, closes both legs and is returned with the direction in it.
func TestCopyError(t *testing.T) {
	errBoom := errors.New("boom")
	client, aTCP := tcpConnPair(t)
	b, server := tcpConnPair(t)
	defer func() {
		for _, c := range []net.Conn{client, aTCP, b, server} {
			c.Close()
		}
	}()
	deadline(t, client, server)
	a := &failingConn{Conn: wrapOpaque(aTCP), failAfter: 10_000, failErr: errBoom}
	done := make(chan copyOutcome, 1)
	go func() {
		res, err := relay.Copy(a, b)
		done <- copyOutcome{res, err}
	}()
	go writeStream(client, 40, 50_000) // more than failAfter; may fail after the abort

	var out copyOutcome
	select {
	case out = <-done:
	case <-time.After(testTimeout):
		t.Fatal("Copy did not return after a read error")
	}
	if !errors.Is(out.err, errBoom) {
		t.Fatalf("Copy error = %v, want one wrapping %v", out.err, errBoom)
	}
	if msg := out.err.Error(); !strings.HasPrefix(msg, "relay: copy a to b: read: ") {
		t.Errorf("Copy error = %q, want it to name the package, direction and operation", msg)
	}
	if out.res.AToB != 10_000 {
		t.Errorf("AToB = %d, want the 10000 bytes read before the failure", out.res.AToB)
	}
	// b is a TCP leg, so the server sees a reset once the bytes before it.
	if _, err := io.Copy(io.Discard, server); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("server read after the failure = %v, want ECONNRESET", err)
	}
}

// TestCopyLiveCounters checks that the counters move while the connection is
// still open, on both the splice and the buffered path.
func TestCopyLiveCounters(t *testing.T) {
	for _, legs := range [][2]legKind{{legTCP, legTCP}, {legOpaque, legOpaque}, {legPush, legTCP}} {
		t.Run(legs[0].String()+"-"+legs[1].String(), func(t *testing.T) {
			r := startRelay(t, legs[0], legs[1])
			deadline(t, r.client, r.server)
			const n = 3 * relay.SpliceChunk
			go io.CopyN(io.Discard, r.server, n)
			if err := writeStream(r.client, 50, n); err != nil {
				t.Fatal(err)
			}
			for start := time.Now(); r.aToB.Load() != n; time.Sleep(time.Millisecond) {
				if time.Since(start) > testTimeout {
					t.Fatalf("aToB counter = %d with the connection open, want %d", r.aToB.Load(), n)
				}
			}
			if got := r.bToA.Load(); got != 0 {
				t.Errorf("bToA counter = %d, want 0", got)
			}
		})
	}
}

// TestCopyImmediateEOF: both sides close their write half at once.
func TestCopyImmediateEOF(t *testing.T) {
	for _, legs := range []legKind{legTCP, legChaos} {
		t.Run(legs.String(), func(t *testing.T) {
			r := startRelay(t, legs, legs)
			r.clientTCP.CloseWrite()
			r.serverTCP.CloseWrite()
			if out := r.wait(t); out.err != nil || out.res != (relay.Result{}) {
				t.Errorf("Copy = %+v, %v; want zero result and nil", out.res, out.err)
			}
		})
	}
}

func deadline(t *testing.T, conns ...net.Conn) {
	t.Helper()
	for _, c := range conns {
		if err := c.SetDeadline(time.Now().Add(testTimeout)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIsBenign(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{net.ErrClosed, true},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{&net.OpError{Op: "readfrom", Err: os.NewSyscallError("splice", syscall.EPIPE)}, true},
		{fmt.Errorf("write: %w", syscall.ECONNABORTED), true},
		{syscall.ENOTCONN, true},
		{io.ErrUnexpectedEOF, true},
		{io.ErrClosedPipe, true},
		{os.ErrDeadlineExceeded, false},
		{syscall.ETIMEDOUT, false},
		{syscall.EHOSTUNREACH, false},
		{errors.New("boom"), false},
	} {
		if got := relay.IsBenign(tc.err); got != tc.want {
			t.Errorf("isBenign(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
