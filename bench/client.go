package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The client side of the test protocol (see role_app.go), run by the
// harness itself.

// closeWriter is the half-close of *net.TCPConn and *tls.Conn.
type closeWriter interface{ CloseWrite() error }

// upload sends for about d on one connection, half-closes, and returns the
// bytes the server counted and the time until its count arrived.
func upload(ctx context.Context, dial dialFunc, d time.Duration) (int64, time.Duration, error) {
	c, err := dial(ctx, []byte{modeUpload})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, bulkBuf)
	start := time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			return 0, 0, fmt.Errorf("upload: %w", err)
		}
	}
	if err := c.(closeWriter).CloseWrite(); err != nil {
		return 0, 0, fmt.Errorf("upload: half-close: %w", err)
	}
	var n [8]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return 0, 0, fmt.Errorf("upload: count: %w", err)
	}
	return int64(binary.BigEndian.Uint64(n[:])), time.Since(start), nil
}

// download receives for about d on one connection and returns the bytes
// received and the time taken.
func download(ctx context.Context, dial dialFunc, d time.Duration) (int64, time.Duration, error) {
	c, err := dial(ctx, []byte{modeDownload})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, bulkBuf)
	var total int64
	start := time.Now()
	for time.Since(start) < d {
		n, err := c.Read(buf)
		total += int64(n)
		if err != nil {
			return 0, 0, fmt.Errorf("download: %w", err)
		}
	}
	return total, time.Since(start), nil
}

// uploadParallel runs n uploads at once, dialed by dials[i % len(dials)],
// and returns their total and the longest time.
func uploadParallel(ctx context.Context, dials []dialFunc, n int, d time.Duration) (int64, time.Duration, error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		total   int64
		longest time.Duration
		errs    []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, t, err := upload(ctx, dials[i%len(dials)], d)
			mu.Lock()
			defer mu.Unlock()
			total += b
			longest = max(longest, t)
			errs = append(errs, err)
		}()
	}
	wg.Wait()
	return total, longest, errors.Join(errs...)
}

// roundTrips sends one byte and waits for its echo n times on one
// connection, returning each round trip's time.
func roundTrips(ctx context.Context, dial dialFunc, n int) ([]time.Duration, error) {
	c, err := dial(ctx, []byte{modeEcho})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	out := make([]time.Duration, 0, n)
	var b [1]byte
	for range n {
		t := time.Now()
		if _, err := c.Write(b[:]); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// connectOnce opens a connection, sends one byte, waits for its echo and
// closes.
func connectOnce(ctx context.Context, dial dialFunc) error {
	c, err := dial(ctx, []byte{modeEcho, 'x'})
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	_, err = io.ReadFull(c, b[:])
	return err
}

// connectRate runs connectOnce in a loop on workers goroutines for about d
// and returns how many completed and the time taken. Any failure fails the
// measurement: a benchmark that drops connections measures nothing.
func connectRate(ctx context.Context, dial dialFunc, workers int, d time.Duration) (int64, time.Duration, error) {
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d && ctx.Err() == nil {
				if err := connectOnce(ctx, dial); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return done.Load(), time.Since(start), firstErr
}

// connectLatencies times n sequential connectOnce calls.
func connectLatencies(ctx context.Context, dial dialFunc, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := connectOnce(ctx, dial); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// openIdle opens n connections with `workers` dialers at a time, each
// carrying one round trip, and leaves them open. The caller closes them.
func openIdle(ctx context.Context, dial dialFunc, n, workers int) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				c, err := dial(ctx, []byte{modeEcho, 'x'})
				if err == nil {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err = io.ReadFull(c, b[:]); err == nil {
						c.SetDeadline(time.Time{})
					}
				}
				if err != nil {
					if c != nil {
						c.Close()
					}
					errs[w] = fmt.Errorf("connection %d: %w", i, err)
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(conns)
		return nil, err
	}
	return conns, nil
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

// probe runs a round trip every interval on one connection and records the
// longest since the last reset: a connection stalled by the proxy shows as
// one long round trip (a stall that starts between two round trips is
// under-reported by at most the interval).
type probe struct {
	c        net.Conn
	interval time.Duration
	longest  atomic.Int64 // nanoseconds
	count    atomic.Int64
	log      *stallLog // nil: none
	done     chan struct{}
	err      error
}

func startProbe(ctx context.Context, dial dialFunc, interval time.Duration, log *stallLog) (*probe, error) {
	c, err := dial(ctx, []byte{modeEcho})
	if err != nil {
		return nil, err
	}
	p := &probe{c: c, interval: interval, log: log, done: make(chan struct{})}
	go p.run()
	return p, nil
}

func (p *probe) run() {
	defer close(p.done)
	var b [1]byte
	for {
		t := time.Now()
		if _, err := p.c.Write(b[:]); err != nil {
			p.err = err
			return
		}
		if _, err := io.ReadFull(p.c, b[:]); err != nil {
			p.err = err
			return
		}
		d := int64(time.Since(t))
		p.log.add(t, time.Duration(d))
		p.count.Add(1)
		for {
			old := p.longest.Load()
			if d <= old || p.longest.CompareAndSwap(old, d) {
				break
			}
		}
		time.Sleep(p.interval)
	}
}

// reset returns the longest round trip and the number of round trips since
// the previous reset, and starts a new window.
func (p *probe) reset() (time.Duration, int64) {
	return time.Duration(p.longest.Swap(0)), p.count.Swap(0)
}

// failure returns why the probe's connection failed, or nil while it runs.
func (p *probe) failure() error {
	select {
	case <-p.done:
		return fmt.Errorf("probe connection failed: %w", p.err)
	default:
		return nil
	}
}

// stop ends the probe and waits for it. It may be called more than once.
func (p *probe) stop() {
	p.c.Close()
	<-p.done
}
