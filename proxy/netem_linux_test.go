package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/workers"
)

// seededStream returns n bytes of the stream of seed.
func seededStream(seed uint64, n int64) io.Reader {
	return io.LimitReader(&seededReader{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, n)
}

type seededReader struct{ r *rand.Rand }

func (p *seededReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.r.Uint32())
	}
	return len(b), nil
}

// writeChunked copies r to w in random chunks of 1 B to 64 KiB.
func writeChunked(w io.Writer, r io.Reader, rng *rand.Rand) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := io.ReadFull(r, buf[:1+rng.IntN(len(buf))])
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return nil // the source is a LimitReader: its end is the end
		}
	}
}

// verifySeeded reads r to EOF and reports whether it was exactly the n
// bytes of seed's stream.
func verifySeeded(r io.Reader, seed uint64, n int64) error {
	want := bufio.NewReaderSize(seededStream(seed, n), 64<<10)
	got := bufio.NewReaderSize(r, 64<<10)
	wb, gb := make([]byte, 32<<10), make([]byte, 32<<10)
	var off int64
	for off < n {
		k := int(min(int64(len(wb)), n-off))
		io.ReadFull(want, wb[:k])
		if m, err := io.ReadFull(got, gb[:k]); err != nil {
			return fmt.Errorf("stream ended at %d of %d: %w", off+int64(m), n, err)
		}
		if !bytes.Equal(wb[:k], gb[:k]) {
			return fmt.Errorf("corrupt bytes in [%d, %d)", off, off+int64(k))
		}
		off += int64(k)
	}
	if m, err := got.Read(gb[:1]); m != 0 || !errors.Is(err, io.EOF) {
		return fmt.Errorf("after %d bytes: %d more, %v; want EOF", n, m, err)
	}
	return nil
}

// TestNetemNoCorruption (TESTPLAN F23): with 200 ms delay, 5% loss and
// reordering on every packet of a namespace (or, on a kernel without
// sch_netem, 5% loss and a 20 Mbit/s bottleneck; see impairLoopback), four CONNECT streams on one
// HBONE connection each carry 1 MiB of seeded random bytes both ways
// through the inbound proxy to an application that checks what it gets
// and answers with its own: every byte arrives, in order, nothing extra,
// and each direction ends with EOF exactly at its length.
func TestNetemNoCorruption(t *testing.T) {
	nstest.RequireRoot(t, "ip", "tc", "iptables")
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction(workers.IdleTop)) }) // first registered, so run last
	const (
		ip      = "10.9.6.3"
		streams = 4
		size    = 1 << 20
	)
	ns := nstest.NewNetns(t)
	nstest.Run(t, "ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	nstest.Run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "v0")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v0", "up")
	nstest.Run(t, "ip", "-n", ns, "link", "set", "v1", "up")
	impairment := impairLoopback(t, ns)
	inNetns := nstest.InNetnsPath("/run/netns/" + ns)

	// The application: reads a stream id, checks the client's stream
	// while it sends its own, reports out of band.
	var appLn net.Listener
	if err := inNetns.Run(func() (err error) { appLn, err = net.Listen("tcp", ip+":8080"); return err }); err != nil {
		t.Fatal(err)
	}
	appResults := make(chan error, streams)
	var app sync.WaitGroup
	app.Go(func() {
		for {
			c, err := appLn.Accept()
			if err != nil {
				return
			}
			app.Go(func() { appResults <- serveSeeded(c.(*net.TCPConn), size) })
		}
	})
	defer func() { appLn.Close(); app.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cc, _ := startInboundInNetns(t, ctx, ip, inNetns)

	start := time.Now()
	clientResults := make(chan error, streams)
	var clients sync.WaitGroup
	for i := range uint64(streams) {
		clients.Go(func() { clientResults <- runSeeded(ctx, cc, ip+":8080", i, size) })
	}
	clients.Wait()
	close(clientResults)
	for err := range clientResults {
		if err != nil {
			t.Errorf("client side: %v", err)
		}
	}
	for range streams {
		select {
		case err := <-appResults:
			if err != nil {
				t.Errorf("application side: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("the application never finished a stream")
		}
	}
	t.Logf("%d streams × %d bytes each way through %s in %v",
		streams, size, impairment, time.Since(start).Round(time.Millisecond))
}

// impairLoopback degrades every packet in namespace ns, which all cross
// lo, and describes how. With sch_netem: 200±20 ms delay, 5% loss and 25%
// reordering each way (TESTPLAN F23). Kernels built without it (the
// Firecracker 6.18 kernel of our CI has no netem) get what they have: 5%
// random loss each way by iptables' statistic match, and a 20 Mbit/s token
// bucket whose queue delays and bunches packets; no reordering.
func impairLoopback(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
		"delay", "200ms", "20ms", "loss", "5%", "reorder", "25%", "50%").CombinedOutput()
	if err == nil {
		return "netem 200ms±20ms delay, 5% loss, 25% reordering"
	}
	t.Logf("no netem (%v: %s); emulating loss with iptables and delay with tbf, without reordering", err, bytes.TrimSpace(out))
	// Ethernet-sized packets, so that loss hits packets as on a wire and
	// no 64 KiB loopback packet exceeds the bucket.
	nstest.Run(t, "ip", "-n", ns, "link", "set", "lo", "mtu", "1500")
	nstest.Run(t, "ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-i", "lo",
		"-m", "statistic", "--mode", "random", "--probability", "0.05", "-j", "DROP")
	nstest.Run(t, "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
		"rate", "20mbit", "burst", "256kb", "latency", "100ms")
	return "5% loss (iptables), 20 Mbit/s tbf bottleneck"
}

// runSeeded opens one CONNECT stream, sends its id and stream 2·id while
// it checks the application's stream 2·id+1, within ctx.
func runSeeded(ctx context.Context, cc *hbone.ClientConn, authority string, id uint64, size int64) error {
	s, err := cc.Connect(ctx, authority, nil)
	if err != nil {
		return fmt.Errorf("stream %d: CONNECT: %w", id, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	sent := make(chan error, 1)
	go func() {
		if err := binary.Write(s, binary.BigEndian, id); err != nil {
			sent <- err
			return
		}
		if err := writeChunked(s, seededStream(2*id, size), rand.New(rand.NewPCG(id, 1))); err != nil {
			sent <- err
			return
		}
		sent <- s.CloseWrite()
	}()
	if err := verifySeeded(s, 2*id+1, size); err != nil {
		return fmt.Errorf("stream %d, application → client: %w", id, err)
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("stream %d, client → application: %w", id, err)
	}
	return nil
}

// serveSeeded is the application's side of runSeeded.
func serveSeeded(c *net.TCPConn, size int64) error {
	defer c.Close()
	c.SetDeadline(time.Now().Add(90 * time.Second))
	var id uint64
	if err := binary.Read(c, binary.BigEndian, &id); err != nil {
		return fmt.Errorf("read stream id: %w", err)
	}
	sent := make(chan error, 1)
	go func() {
		if err := writeChunked(c, seededStream(2*id+1, size), rand.New(rand.NewPCG(id, 2))); err != nil {
			sent <- err
			return
		}
		sent <- c.CloseWrite()
	}()
	if err := verifySeeded(c, 2*id, size); err != nil {
		return fmt.Errorf("stream %d, client → application: %w", id, err)
	}
	if err := <-sent; err != nil {
		return fmt.Errorf("stream %d, application → client: %w", id, err)
	}
	return nil
}
