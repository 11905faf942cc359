// Package admission is the process's admission control: it refuses new
// connections while the process is short of memory and tells readiness
// when it is short of memory or file descriptors. One Controller is built
// per process and handed to every proxy; it holds no per-workload state,
// and connections already open are never touched.
package admission

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Controller is the process's admission control, shared by every proxy
// (TESTPLAN F21, F22). It is not part of ztunnel, which has no garbage
// collector to outgrow and no such control.
//
//   - Memory: a goroutine (Run) samples the Go runtime's memory every
//     Interval and compares it with the memory limit in force. Above the
//     high-water mark new connections are refused until the memory falls
//     below the low-water mark: an accepted TCP connection on any listener
//     is reset at once (SO_LINGER 0), and a new CONNECT on an HBONE
//     connection already open is answered 503, the status ztunnel's own
//     inbound answers when it cannot serve a request (src/proxy/inbound.rs,
//     InboundError::build(StatusCode::SERVICE_UNAVAILABLE)); a ztunnel peer
//     fails only that request and keeps the pooled connection for its
//     other streams (src/proxy/h2/client.rs, send_request: a status other
//     than 200 is Error::HttpStatus). Refusing the TCP connection alone
//     would not do: pooled connections carry up to 100 new streams each
//     without a new accept. An accept or a CONNECT reads one atomic flag;
//     only the sampler reads runtime/metrics.
//   - File descriptors: the accept loops record a sustained exhaustion (as
//     long as shedding needs, proxy's accept.go; NoteFDExhausted), and
//     readiness reports it until fdReadyHold has passed without one.
//
// Connections already open are never touched: they keep relaying.
type Controller struct {
	cfg Config
	log *slog.Logger
	// read samples the memory in use; readMemory unless a test sets it.
	read func() uint64

	shedding atomic.Bool
	inUse    atomic.Uint64 // the last sample
	// fdExhausted is when an accept loop last found the descriptors
	// exhausted for long enough to shed (UnixNano), or 0.
	fdExhausted atomic.Int64

	mu sync.Mutex
	// lastLog is when a memory shed was last logged; unlogged counts
	// the sheds since.
	lastLog  time.Time
	unlogged int
}

// Config configures a Controller. Zero values mean the documented
// defaults.
type Config struct {
	// MemoryLimit is the memory limit in force, in bytes: the lower of the
	// Go runtime's (GOMEMLIMIT) and the cgroup's. Zero or negative turns
	// memory admission off.
	MemoryLimit int64
	// Interval is how often the memory is sampled; if zero 100ms.
	Interval time.Duration
	// Logger receives the state changes and the rate-limited shedding
	// lines; if nil they are discarded.
	Logger *slog.Logger
	// ReadMemory returns the memory in use that MemoryLimit is compared
	// with; if nil, the process's as the last collection tells
	// (readMemory). Tests set it to drive the watermarks.
	ReadMemory func() uint64
}

// highWater and lowWater are the fractions of the memory limit above which
// new connections are refused and below which they are accepted again.
const (
	highWater = 0.85
	lowWater  = 0.75
)

// fdReadyHold is how long readiness stays failed after the accept loops
// last shed for lack of file descriptors. Readiness turns only on a
// sustained exhaustion (shedAfter backoffs in a row, about 200 ms), so a
// single EMFILE, a burst that frees its descriptors at once, never flips
// it; and it turns back only after two seconds without one, so a process
// at the edge of its limit, failing every few accepts, does not flap
// between ready and not ready with every success.
const fdReadyHold = 2 * time.Second

// memShedLogEvery rate-limits the memory-shedding log line.
const memShedLogEvery = time.Second

// gcWhileShedding is how long, while shedding, the sampler waits for a
// garbage collection before forcing one: the live heap it compares is
// measured by the last collection, and a process that refuses new
// connections may allocate too little to start one for minutes (the
// forced period is 2 minutes), so freed memory would keep it shedding.
const gcWhileShedding = time.Second

// New returns a Controller; Run samples the memory.
func New(cfg Config) *Controller {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	read := cfg.ReadMemory
	if read == nil {
		read = readMemory
	}
	return &Controller{cfg: cfg, log: log, read: read}
}

func (a *Controller) interval() time.Duration {
	if a.cfg.Interval > 0 {
		return a.cfg.Interval
	}
	return 100 * time.Millisecond
}

// Run samples the memory until ctx is done; with memory admission off it
// returns at once.
func (a *Controller) Run(ctx context.Context) error {
	if a.cfg.MemoryLimit <= 0 {
		return nil
	}
	high := uint64(float64(a.cfg.MemoryLimit) * highWater)
	low := uint64(float64(a.cfg.MemoryLimit) * lowWater)
	a.log.Info("memory admission control", "limit", a.cfg.MemoryLimit, "high_water", high, "low_water", low)
	t := time.NewTicker(a.interval())
	defer t.Stop()
	gcs := [1]metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	var lastGC uint64
	lastGCAt := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		used := a.read()
		a.inUse.Store(used)
		switch shedding := a.shedding.Load(); {
		case !shedding && used > high:
			a.shedding.Store(true)
			a.log.Warn("memory above the high-water mark: refusing new connections", "in_use", used, "high_water", high, "limit", a.cfg.MemoryLimit)
		case shedding && used < low:
			a.shedding.Store(false)
			a.log.Info("memory below the low-water mark: accepting new connections", "in_use", used, "low_water", low)
		case shedding:
			metrics.Read(gcs[:])
			if n := gcs[0].Value.Uint64(); n != lastGC {
				lastGC, lastGCAt = n, time.Now()
			} else if time.Since(lastGCAt) >= gcWhileShedding {
				runtime.GC()
				lastGCAt = time.Now()
			}
		}
	}
}

// memorySamples are the runtime/metrics readMemory reads.
var memorySamples = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/heap/live:bytes",
}

// readMemory is the memory the process would still hold after a garbage
// collection, as far as the last collection tells: everything the runtime
// has mapped and not returned to the OS, less the free heap and every heap
// object allocated since the last collection (objects less the live heap
// it marked), whether still live or not. Live growth since then shows only
// after the next collection, which is why the sampler forces one while
// shedding (gcWhileShedding). Idle connections (goroutine stacks, buffers)
// and pinned buffers count; garbage does not, so a process near GOMEMLIMIT
// that the collector keeps there is not shedding, but one whose live memory
// approaches the limit is.
func readMemory() uint64 {
	s := make([]metrics.Sample, len(memorySamples))
	for i, name := range memorySamples {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	total, released, free, objects, live := v(0), v(1), v(2), v(3), v(4)
	held := total - min(total, released+free)
	dead := objects - min(objects, live)
	return held - min(held, dead)
}

// BlockReadiness registers with block (admin.Readiness.BlockWhile) the
// conditions under which a proxy using a is not ready: new connections are
// shed for lack of file descriptors or memory. They are gozt's, not
// ztunnel's, whose readiness tracks start-up tasks only.
func (a *Controller) BlockReadiness(block func(name string, blocked func() bool)) {
	block("file descriptors exhausted", a.FDExhausted)
	block("memory pressure", a.MemoryPressure)
}

// MemoryPressure reports whether new connections are being refused for
// memory; a nil Controller never refuses.
func (a *Controller) MemoryPressure() bool {
	return a != nil && a.shedding.Load()
}

// FDExhausted reports whether the accept loops shed for lack of file
// descriptors within the last fdReadyHold.
func (a *Controller) FDExhausted() bool {
	if a == nil {
		return false
	}
	at := a.fdExhausted.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < fdReadyHold
}

// NoteFDExhausted records a sustained descriptor exhaustion now; on a nil
// Controller it does nothing.
func (a *Controller) NoteFDExhausted() {
	if a != nil {
		a.fdExhausted.Store(time.Now().UnixNano())
	}
}

// NoteMemoryShed logs a connection refused for memory, at most once per
// memShedLogEvery with the number refused since the last line, on every
// listener (gozt_connections_shed_total counts them per listener).
func (a *Controller) NoteMemoryShed() {
	a.mu.Lock()
	a.unlogged++
	now := time.Now()
	n := a.unlogged
	logIt := now.Sub(a.lastLog) >= memShedLogEvery
	if logIt {
		a.lastLog, a.unlogged = now, 0
	}
	a.mu.Unlock()
	if logIt {
		a.log.Warn("refusing new connections: memory pressure", "refused", n,
			"in_use", a.inUse.Load(), "limit", a.cfg.MemoryLimit)
	}
}
