package local

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/internal/syncbuf"
)

// soakParams sizes the soak (TESTPLAN L1) and churn (L2) phases: a short
// run in `make test`, a long one behind `make soak` (GOZT_SOAK=1), scaled
// by SOAK_CONNS, SOAK_BYTES and SOAK_CHURN.
type soakParams struct {
	conns    int // concurrent long-lived connections
	maxBytes int // most bytes each way per connection
	churn    int // short connections in the churn phase
}

func soakConfig(t *testing.T) soakParams {
	p := soakParams{conns: 100, maxBytes: 128 << 10, churn: 2000}
	if os.Getenv("GOZT_SOAK") == "1" {
		p = soakParams{conns: 1000, maxBytes: 8 << 20, churn: 100000}
	}
	for name, v := range map[string]*int{"SOAK_CONNS": &p.conns, "SOAK_BYTES": &p.maxBytes, "SOAK_CHURN": &p.churn} {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive integer", name, s)
			}
			*v = n
		}
	}
	return p
}

// soakStream is the bytes one side of connection id sends: seeded, of a
// seeded length, written in seeded chunk sizes.
type soakStream struct {
	seed uint64
	n    int
}

func newSoakStream(id uint64, dir byte, maxBytes int) soakStream {
	seed := id<<8 | uint64(dir)
	r := rand.New(rand.NewPCG(seed, 1))
	return soakStream{seed: seed, n: 1 + r.IntN(maxBytes)}
}

// write sends the stream in random chunks; abortAt >= 0 stops after that
// many bytes.
func (s soakStream) write(w io.Writer, abortAt int) error {
	src := rand.NewChaCha8(seed32(s.seed))
	chunks := rand.New(rand.NewPCG(s.seed, 2))
	buf := make([]byte, 64<<10)
	limit := s.n
	if abortAt >= 0 {
		limit = min(abortAt, s.n)
	}
	for sent := 0; sent < limit; {
		k := min(1+chunks.IntN(len(buf)), limit-sent)
		src.Read(buf[:k])
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		sent += k
	}
	return nil
}

// digest is the length and SHA-256 of the whole stream.
func (s soakStream) digest() (int, [32]byte) {
	src := rand.NewChaCha8(seed32(s.seed))
	h := sha256.New()
	io.CopyN(h, src, int64(s.n))
	var d [32]byte
	h.Sum(d[:0])
	return s.n, d
}

func seed32(seed uint64) [32]byte {
	var b [32]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	return b
}

// readDigest reads r to its end and returns the length and SHA-256 of what
// it read, and the read error other than EOF.
func readDigest(r io.Reader) (int, [32]byte, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	var d [32]byte
	h.Sum(d[:0])
	return int(n), d, err
}

// soakServer is the destination application: for each connection it reads
// an 8-byte id, then reads the client's stream to its end while it sends
// its own, and records what it received.
type soakServer struct {
	maxBytes int
	mu       sync.Mutex
	got      map[uint64]soakResult
	wg       sync.WaitGroup
}

type soakResult struct {
	n   int
	sum [32]byte
	err error
}

func (s *soakServer) serve(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.handle(c.(*net.TCPConn))
	}
}

func (s *soakServer) handle(c *net.TCPConn) {
	defer s.wg.Done()
	defer c.Close()
	var idb [8]byte
	if _, err := io.ReadFull(c, idb[:]); err != nil {
		return
	}
	id := binary.BigEndian.Uint64(idb[:])
	sent := make(chan error, 1)
	go func() {
		err := newSoakStream(id, 'S', s.maxBytes).write(c, -1)
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	n, sum, err := readDigest(c)
	if werr := <-sent; err == nil {
		err = werr
	}
	s.mu.Lock()
	s.got[id] = soakResult{n: n, sum: sum, err: err}
	s.mu.Unlock()
}

// procStats are the process's goroutines, open fds and resident memory.
type procStats struct {
	goroutines, fds int
	rssKiB          int
}

func readProcStats() procStats {
	st := procStats{goroutines: runtime.NumGoroutine()}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		st.fds = len(ents)
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				st.rssKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			}
		}
	}
	return st
}

// TestSoak (TESTPLAN L1, L2): many concurrent long-lived connections
// through the mesh (SOCKS5 → HBONE → inbound → destination) carry seeded
// random streams in random chunk sizes both ways, each direction
// half-closed on its own, a tenth of them aborted by the client midway;
// every byte of the others arrives (lengths and SHA-256 compared out of
// band), every abort reaches the destination as an error; then a churn of
// short connections succeeds at ≥ 99.99%; and goroutines and fds return
// to their baseline afterwards.
func TestSoak(t *testing.T) {
	p := soakConfig(t)
	// The mesh logs at WARN into memory: what logMeshErrors reads. At
	// INFO the buffer would hold an access-log line per connection, 128
	// MiB of live heap after the long soak's 100,000 (the "RSS ended at
	// 175 MiB" of issue 36 was that buffer; see bench/NOTES.md).
	logs := &syncbuf.Buffer{}
	tm := startMeshOpts(t, "", Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	tm.logs = logs
	ln, err := net.Listen("tcp", tm.ips.Server+":9100")
	if err != nil {
		t.Fatal(err)
	}
	srv := &soakServer{maxBytes: p.maxBytes, got: map[uint64]soakResult{}}
	srv.wg.Add(1)
	go srv.serve(ln)
	churnLn := listenChurn(t, tm.ips.Server+":9101")

	// Warm up: the first connections create what the mesh keeps (a pooled
	// HBONE connection, the certificates), which the baseline includes.
	var warm atomic.Int64
	if err := soakClient(tm, uint64(p.conns), p.maxBytes, false, &warm); err != nil {
		t.Fatalf("warm-up connection: %v", err)
	}
	if failed := churn(tm, 16, 16); failed != 0 {
		t.Fatalf("warm-up churn: %d of 16 failed", failed)
	}
	time.Sleep(200 * time.Millisecond)
	base := readProcStats()
	t.Logf("soak memory at the start: %s", memReport())
	var peakRSS atomic.Int64
	stopSample := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for tick := time.NewTicker(100 * time.Millisecond); ; {
			select {
			case <-stopSample:
				tick.Stop()
				return
			case <-tick.C:
				if r := int64(readProcStats().rssKiB); r > peakRSS.Load() {
					peakRSS.Store(r)
				}
			}
		}
	}()
	start := time.Now()

	aborted := func(id uint64) bool { return id%10 == 7 }
	var wg sync.WaitGroup
	errs := make(chan error, p.conns)
	var moved atomic.Int64
	for i := range p.conns {
		id := uint64(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := soakClient(tm, id, p.maxBytes, aborted(id), &moved); err != nil {
				errs <- fmt.Errorf("connection %d: %w", id, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		logMeshErrors(t, tm)
	}
	soakDur := time.Since(start)

	// What the destination received, connection by connection.
	waitFor(t, 10*time.Second, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.got) == p.conns+1
	}, "the destination to finish every connection")
	srv.mu.Lock()
	for i := range p.conns {
		id := uint64(i)
		got := srv.got[id]
		if aborted(id) {
			if got.err == nil {
				t.Errorf("connection %d was aborted by its client, but the destination read a clean end after %d bytes", id, got.n)
			}
			continue
		}
		n, sum := newSoakStream(id, 'C', p.maxBytes).digest()
		if got.err != nil || got.n != n || got.sum != sum {
			t.Errorf("connection %d: the destination received %d bytes (err %v), want %d with the sender's SHA-256 (match %v)",
				id, got.n, got.err, n, got.sum == sum)
		}
	}
	srv.mu.Unlock()

	// Churn: short connections, as fast as the machine goes.
	churnStart := time.Now()
	failed := churn(tm, p.churn, 16)
	churnDur := time.Since(churnStart)
	if rate := 1 - float64(failed)/float64(p.churn); rate < 0.9999 {
		t.Errorf("churn: %d of %d short connections failed (%.4f%% success, want ≥ 99.99%%)", failed, p.churn, 100*rate)
	}

	close(stopSample)
	<-sampled
	ln.Close()
	churnLn.Close()
	srv.wg.Wait()
	// Where the memory is once the mesh has let go of every connection:
	// after a collection, then (in the long soak) after the scavenger has
	// had a minute, then after returning every free page to the OS.
	runtime.GC()
	t.Logf("soak memory after a GC: %s", memReport())
	if os.Getenv("GOZT_SOAK") == "1" {
		time.Sleep(time.Minute)
		t.Logf("soak memory a minute later: %s", memReport())
	}
	writeSoakHeapProfile(t)
	// Back to the baseline once the mesh has let go of every connection.
	var end procStats
	debug.FreeOSMemory()
	t.Logf("soak memory after FreeOSMemory: %s", memReport())
	ok := false
	for deadline := time.Now().Add(15 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		end = readProcStats()
		ok = end.goroutines <= base.goroutines+2 && end.fds <= base.fds+2
	}
	if !ok {
		var stacks strings.Builder
		pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Errorf("goroutines %d, fds %d after the soak; baseline %d, %d\n%s", end.goroutines, end.fds, base.goroutines, base.fds, &stacks)
	}
	t.Logf("soak: %d connections, %.1f MiB moved in %v; churn: %d connections in %v (%.0f/s), %d failed",
		p.conns, float64(moved.Load())/(1<<20), soakDur.Round(time.Millisecond), p.churn, churnDur.Round(time.Millisecond),
		float64(p.churn)/churnDur.Seconds(), failed)
	t.Logf("soak: goroutines %d → %d, fds %d → %d, RSS %d KiB → peak %d KiB → %d KiB",
		base.goroutines, end.goroutines, base.fds, end.fds, base.rssKiB, peakRSS.Load(), end.rssKiB)
}

// soakClient runs connection id from the client's side: its id, then its
// stream while it reads the destination's, each half-closed at its end;
// or, if abort, a reset after part of its stream.
func soakClient(tm *testMesh, id uint64, maxBytes int, abort bool, moved *atomic.Int64) error {
	c, err := socks5Dial(tm.ips.Client+":15080", tm.ips.Server+":9100")
	if err != nil {
		return err
	}
	defer c.Close()
	var idb [8]byte
	binary.BigEndian.PutUint64(idb[:], id)
	if _, err := c.Write(idb[:]); err != nil {
		return err
	}
	out := newSoakStream(id, 'C', maxBytes)
	if abort {
		if err := out.write(c, out.n/2); err != nil {
			return err
		}
		c.SetLinger(0)
		return nil // the deferred Close resets the connection
	}
	sent := make(chan error, 1)
	go func() {
		err := out.write(c, -1)
		if err == nil {
			err = c.CloseWrite()
		}
		sent <- err
	}()
	n, sum, err := readDigest(c)
	if werr := <-sent; werr != nil {
		return fmt.Errorf("send: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("receive after %d bytes: %w", n, err)
	}
	wantN, wantSum := newSoakStream(id, 'S', maxBytes).digest()
	if n != wantN || sum != wantSum {
		return fmt.Errorf("received %d bytes, want %d with the destination's SHA-256 (match %v)", n, wantN, sum == wantSum)
	}
	moved.Add(int64(n + out.n))
	return nil
}

// listenChurn serves the churn phase: read a 1 KiB request, answer 4 KiB.
func listenChurn(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp := bytes.Repeat([]byte("r"), 4<<10)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req := make([]byte, 1<<10)
				if _, err := io.ReadFull(c, req); err == nil {
					c.Write(resp)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln
}

// churn opens n short connections, par at a time, and returns how many
// failed.
func churn(tm *testMesh, n, par int) int {
	var failed, next atomic.Int64
	var wg sync.WaitGroup
	req := bytes.Repeat([]byte("q"), 1<<10)
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := churnOne(tm, req); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

func churnOne(tm *testMesh, req []byte) error {
	c, err := socks5Dial(tm.ips.Client+":15080", tm.ips.Server+":9101")
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		return err
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if len(got) != 4<<10 {
		return errors.New("short answer")
	}
	return nil
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// logMeshErrors logs each distinct warning and error message the mesh
// logged, with how often, so that a failed soak says what gozt saw.
func logMeshErrors(t *testing.T, tm *testMesh) {
	t.Helper()
	counts := map[string]int{}
	for line := range strings.Lines(tm.logs.String()) {
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		key := line
		if i := strings.Index(line, "level="); i >= 0 {
			key = line[i:] // without the time
		}
		if i := strings.Index(key, " src.addr="); i >= 0 {
			rest := key[i:]
			key = key[:i] // without per-connection addresses
			if j := strings.Index(rest, " direction="); j >= 0 {
				key += rest[j:] // but with the direction, the error and the flags
			}
		}
		counts[strings.TrimSpace(key)]++
	}
	for k, n := range counts {
		t.Logf("mesh logged %d× %s", n, k)
	}
}
