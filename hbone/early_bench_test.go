package hbone

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// delayConn delivers each write to the underlying connection a fixed delay
// later, in order: a link with that one-way latency, standing in for the
// network between two nodes.
type delayConn struct {
	net.Conn
	delay time.Duration
	ch    chan delayed
	mu    sync.Mutex
	shut  bool
	done  chan struct{}
}

type delayed struct {
	at time.Time
	b  []byte
}

func newDelayConn(c net.Conn, d time.Duration) *delayConn {
	dc := &delayConn{Conn: c, delay: d, ch: make(chan delayed, 1024), done: make(chan struct{})}
	go func() {
		defer close(dc.done)
		for it := range dc.ch {
			time.Sleep(time.Until(it.at))
			if _, err := dc.Conn.Write(it.b); err != nil {
				return
			}
		}
	}()
	return dc
}

func (d *delayConn) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shut {
		return 0, net.ErrClosed
	}
	d.ch <- delayed{time.Now().Add(d.delay), append([]byte(nil), p...)}
	return len(p), nil
}

func (d *delayConn) Close() error {
	d.mu.Lock()
	if !d.shut {
		d.shut = true
		close(d.ch)
	}
	d.mu.Unlock()
	return d.Conn.Close()
}

// BenchmarkConnectFirstByte measures a client-speaks-first exchange on a
// new stream of an open connection whose link has a one-way latency (the
// sub-benchmark's name): CONNECT, one byte, its echo. "wait" writes the
// byte once the 200 is in, as ztunnel does; "early" has ConnectEarly send
// it with the CONNECT. Over a link of latency d, wait takes about 4d, early
// 2d: one crossing of the tunnel each way less.
func BenchmarkConnectFirstByte(b *testing.B) {
	for _, d := range []time.Duration{0, 500 * time.Microsecond} {
		for _, early := range []bool{false, true} {
			name := d.String() + "/wait"
			if early {
				name = d.String() + "/early"
			}
			b.Run(name, func(b *testing.B) {
				cn, sn := tcpPairOn(b, earlyIP)
				srv := &Server{Handler: echoHandler}
				go srv.ServeConn(context.Background(), newDelayConn(sn, d))
				b.Cleanup(func() { srv.Close() })
				cc, err := NewClientConn(context.Background(), newDelayConn(cn, d), Config{})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { cc.Close() })
				app, src := tcpPairOn(b, earlyIP)
				var one [1]byte
				b.ResetTimer()
				for range b.N {
					var s *ClientStream
					if early {
						app.Write(one[:])
						s, err = cc.ConnectEarly(context.Background(), "10.0.0.1:80", nil, src)
						if err == nil && s.EarlyBytes() == 0 {
							// Answered before the byte was read: it is
							// still in src, for the relay to send.
							if _, err = io.ReadFull(src, one[:]); err == nil {
								_, err = s.Write(one[:])
							}
						}
					} else {
						s, err = cc.Connect(context.Background(), "10.0.0.1:80", nil)
						if err == nil {
							_, err = s.Write(one[:])
						}
					}
					if err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(s, one[:]); err != nil {
						b.Fatal(err)
					}
					s.Close()
				}
			})
		}
	}
}
