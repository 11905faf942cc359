package hbone

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Key identifies the connections a Pool may share between tunnels (SPEC
// §3.6): tunnels share a connection only when all four fields match.
type Key struct {
	SrcIdentity   string         // source workload SPIFFE id
	DstIdentities string         // canonical list of expected server SANs (the caller sorts and joins)
	Dst           netip.AddrPort // e.g. podIP:15008
	SrcIP         netip.Addr     // downstream source IP
}

// DialFunc dials a new connection for key: TCP, TLS and NewClientConn.
type DialFunc func(ctx context.Context, key Key) (*ClientConn, error)

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Dial opens connections. It is required.
	Dial DialFunc
	// MaxStreamsPerConn is about how many streams share one connection
	// before the pool dials another for the same key. If zero, 100 is used.
	MaxStreamsPerConn int
	// IdleTimeout is how long a pooled connection may go without a new
	// stream before the pool drops it; it closes once its streams end. If
	// zero, 5m is used.
	IdleTimeout time.Duration
	// Logger receives diagnostics, or nil to discard them.
	Logger *slog.Logger
}

// Pool keeps HBONE client connections per Key.
//
// Invariants (SPEC §3.6):
//   - At most one dial per key is in flight; concurrent Connects for a key
//     wait for it, and all of them get its error if it fails (the next
//     Connect dials again).
//   - A connection is handed out only while CanTakeNewStream; it stays in
//     the pool after a checkout only if it still has room for another stream
//     (active < MaxStreamsPerConn). A connection that left the pool is never
//     put back; it closes when its last stream ends.
//   - A pooled connection without a checkout for IdleTimeout leaves the pool.
//   - Every connection the pool dialed is in all until its goroutines have
//     exited, so Close can wait for them.
type Pool struct {
	cfg    PoolConfig
	ctx    context.Context // lifetime of dials, canceled by Close
	cancel context.CancelFunc

	mu      sync.Mutex
	entries map[Key]*poolEntry
	all     map[*pooledConn]struct{}
	closed  bool
	wg      sync.WaitGroup // dials and closes in flight
}

type poolEntry struct {
	conns   []*pooledConn
	dialing *dialCall
}

// pooledConn is a connection the pool dialed; its fields are guarded by
// Pool.mu.
type pooledConn struct {
	cc       *ClientConn
	key      Key
	inPool   bool
	closing  bool
	lastUsed time.Time
	timer    *time.Timer
}

type dialCall struct {
	done chan struct{}
	err  error
}

var errDialNoCapacity = errors.New("hbone: new connection cannot take a stream")

// NewPool returns an empty pool. cfg.Dial is required.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.Dial == nil {
		panic("hbone: NewPool with nil Dial")
	}
	if cfg.MaxStreamsPerConn <= 0 {
		cfg.MaxStreamsPerConn = 100
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool{
		cfg:     cfg,
		ctx:     ctx,
		cancel:  cancel,
		entries: make(map[Key]*poolEntry),
		all:     make(map[*pooledConn]struct{}),
	}
}

// Connect opens a tunnel to authority on a pooled connection for key,
// dialing one if needed. Requests the peer left unprocessed (refused stream,
// GOAWAY) are retried on another connection: a connection that refused a
// stream leaves the pool first, so the retry never goes back to it.
func (p *Pool) Connect(ctx context.Context, key Key, authority string, h http.Header) (*ClientStream, error) {
	return p.connect(ctx, key, authority, h, nil)
}

// ConnectEarly is Connect with the tunnel's first bytes read from src and
// sent before the response, as ClientConn.ConnectEarly does. The bytes are
// kept until a response: a retry after a refused stream sends them again,
// byte for byte, on the new stream.
func (p *Pool) ConnectEarly(ctx context.Context, key Key, authority string, h http.Header, src EarlySource) (*ClientStream, error) {
	return p.connect(ctx, key, authority, h, &early{src: src})
}

func (p *Pool) connect(ctx context.Context, key Key, authority string, h http.Header, e *early) (*ClientStream, error) {
	defer e.release()
	const maxAttempts = 3
	var err error
	for range maxAttempts {
		var pc *pooledConn
		if pc, err = p.checkout(ctx, key); err != nil {
			if errors.Is(err, errDialNoCapacity) && ctx.Err() == nil {
				continue // sent away before its first stream (a draining server): dial again
			}
			return nil, err
		}
		var s *ClientStream
		if s, err = pc.cc.c.connect(ctx, authority, h, e); err == nil {
			return s, nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		if errors.Is(err, ErrRefused) {
			p.retire(pc)
		}
	}
	return nil, err
}

// retire takes pc out of the pool after it refused a stream: the server
// disagrees with us on what the connection can take, so new streams go to
// another connection (a new one if need be). pc closes once its streams end.
func (p *Pool) retire(pc *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropLocked(pc)
}

// dropLocked takes pc out of the pool for good: it closes now if it has no
// stream, and otherwise when its last one ends (connIdle).
func (p *Pool) dropLocked(pc *pooledConn) {
	if e := p.entries[pc.key]; e != nil {
		p.removeLocked(e, pc)
		if len(e.conns) == 0 && e.dialing == nil {
			delete(p.entries, pc.key)
		}
	}
	if pc.cc.ActiveStreams() == 0 {
		p.closeLocked(pc)
	}
}

// checkout returns a connection for key with a stream slot reserved.
func (p *Pool) checkout(ctx context.Context, key Key) (*pooledConn, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		e := p.entries[key]
		if e == nil {
			e = &poolEntry{}
			p.entries[key] = e
		}
		if pc := p.takeLocked(e); pc != nil {
			p.mu.Unlock()
			return pc, nil
		}
		call := e.dialing
		if call == nil {
			call = &dialCall{done: make(chan struct{})}
			e.dialing = call
			p.wg.Add(1)
			go p.dial(ctx, key, call)
		}
		p.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if call.err != nil {
			return nil, call.err
		}
	}
}

// takeLocked reserves a stream on a pooled connection of e, dropping
// connections that can take no more.
func (p *Pool) takeLocked(e *poolEntry) *pooledConn {
	for len(e.conns) > 0 {
		pc := e.conns[0]
		if pc.cc.c.reserve() != nil {
			p.removeLocked(e, pc)
			if pc.cc.ActiveStreams() == 0 {
				p.closeLocked(pc)
			}
			continue
		}
		pc.lastUsed = time.Now()
		pc.timer.Reset(p.cfg.IdleTimeout)
		if pc.cc.ActiveStreams() >= p.cfg.MaxStreamsPerConn {
			p.removeLocked(e, pc) // full: never back in the pool
		}
		return pc
	}
	return nil
}

// removeLocked takes pc out of its entry's pool.
func (p *Pool) removeLocked(e *poolEntry, pc *pooledConn) {
	if !pc.inPool {
		return
	}
	pc.inPool = false
	pc.timer.Stop()
	for i, x := range e.conns {
		if x == pc {
			e.conns = append(e.conns[:i], e.conns[i+1:]...)
			break
		}
	}
}

// dial runs one dial for key and publishes the result to its waiters. The
// dial is not canceled with the Connect that started it (others may wait on
// it), but it keeps that Connect's deadline (the connect timeout) and ends
// with the pool.
func (p *Pool) dial(reqCtx context.Context, key Key, call *dialCall) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(context.WithoutCancel(reqCtx))
	if dl, ok := reqCtx.Deadline(); ok {
		cancel()
		ctx, cancel = context.WithDeadline(context.WithoutCancel(reqCtx), dl)
	}
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	cc, err := p.cfg.Dial(ctx, key)
	if err == nil && cc == nil {
		err = errors.New("hbone: DialFunc returned no connection")
	}
	if err == nil && !cc.CanTakeNewStream() {
		cc.Close()
		err = errDialNoCapacity
	}
	p.mu.Lock()
	if e := p.entries[key]; e != nil {
		e.dialing = nil
	}
	if err == nil && p.closed {
		err = ErrPoolClosed
		p.mu.Unlock()
		cc.Close()
	} else {
		if err == nil {
			p.addLocked(key, cc)
		} else if e := p.entries[key]; e != nil && len(e.conns) == 0 {
			delete(p.entries, key)
		}
		p.mu.Unlock()
	}
	if err != nil {
		p.cfg.Logger.Debug("hbone: pool dial failed", "dst", key.Dst, "err", err)
	}
	call.err = err
	close(call.done)
}

func (p *Pool) addLocked(key Key, cc *ClientConn) {
	pc := &pooledConn{cc: cc, key: key, inPool: true, lastUsed: time.Now()}
	pc.timer = time.AfterFunc(p.cfg.IdleTimeout, func() { p.idleExpired(pc) })
	e := p.entries[key]
	if e == nil {
		e = &poolEntry{}
		p.entries[key] = e
	}
	e.conns = append(e.conns, pc)
	p.all[pc] = struct{}{}
	c := cc.c
	c.mu.Lock()
	c.onIdle = func() { p.connIdle(pc) }
	c.onDone = func() { p.connDone(pc) }
	dead := c.err != nil
	c.mu.Unlock()
	if dead {
		p.removeLocked(e, pc)
		p.closeLocked(pc)
	}
}

// connIdle is called when a connection's last stream ends: a connection
// outside the pool will not be used again.
func (p *Pool) connIdle(pc *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !pc.inPool {
		p.closeLocked(pc)
	}
}

// connDone is called when a connection fails.
func (p *Pool) connDone(pc *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.entries[pc.key]; e != nil {
		p.removeLocked(e, pc)
		if len(e.conns) == 0 && e.dialing == nil {
			delete(p.entries, pc.key)
		}
	}
	p.closeLocked(pc)
}

// idleExpired drops a pooled connection nobody checked out for IdleTimeout.
func (p *Pool) idleExpired(pc *pooledConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !pc.inPool {
		return
	}
	if d := time.Since(pc.lastUsed); d < p.cfg.IdleTimeout {
		pc.timer.Reset(p.cfg.IdleTimeout - d)
		return
	}
	p.dropLocked(pc)
}

// closeLocked closes pc on a tracked goroutine (ClientConn.Close waits for
// the connection's goroutines; callers here hold locks or run on them).
func (p *Pool) closeLocked(pc *pooledConn) {
	if pc.closing || p.closed {
		return
	}
	pc.closing = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Gracefully: GOAWAY, then close once the peer has seen it.
		ctx, cancel := context.WithTimeout(p.ctx, 2*goAwayTimeout)
		pc.cc.Shutdown(ctx)
		cancel()
		pc.cc.Close()
		p.mu.Lock()
		delete(p.all, pc)
		p.mu.Unlock()
	}()
}

// Close closes every connection, cancels dials in flight and waits for all
// of the pool's goroutines. Connect fails with ErrPoolClosed afterwards.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.cancel()
	conns := make([]*pooledConn, 0, len(p.all))
	for pc := range p.all {
		conns = append(conns, pc)
		pc.timer.Stop()
	}
	clear(p.all)
	clear(p.entries)
	p.mu.Unlock()
	for _, pc := range conns {
		pc.cc.Close()
	}
	p.wg.Wait()
	return nil
}
