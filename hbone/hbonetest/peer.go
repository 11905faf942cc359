// Package hbonetest provides a frame-level HTTP/2 peer for tests of HBONE
// servers and clients: hbone's own tests and those of the binaries that
// serve HBONE on 15008. It imports testing and no module package, so the
// gozt binary must not link it and hbone's internal tests may import it.
package hbonetest

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Config sets a Peer's time limits and how it frames what it sends. The zero
// Config is a peer that waits 10s and sends each header block in one
// HEADERS frame.
type Config struct {
	// Wait bounds each Want. If zero, 10s is used.
	Wait time.Duration
	// CloseWait bounds WantClosed. If zero, 10s is used.
	CloseWait time.Duration
	// MaxReadFrameSize is the largest frame the reader accepts; a larger one
	// ends the reader. If zero, x/net's default of 16 KiB is used.
	MaxReadFrameSize uint32
	// SplitHeaders makes Headers and Connect send their block as WriteBlock
	// does, in fragments of at most 16 KiB; if false, the whole block goes in
	// one HEADERS frame, however large.
	SplitHeaders bool
}

func (c Config) wait() time.Duration {
	if c.Wait == 0 {
		return 10 * time.Second
	}
	return c.Wait
}

func (c Config) closeWait() time.Duration {
	if c.CloseWait == 0 {
		return 10 * time.Second
	}
	return c.CloseWait
}

// Peer is a frame-level HTTP/2 peer built on x/net's Framer, for feeding a
// server or client frames a well-behaved implementation would not send.
//
// Only the test goroutine writes (one writer at a time: the Framer is not
// safe for concurrent writes); a reader goroutine decodes what arrives into
// Frames, and closes that channel when the connection ends.
type Peer struct {
	// Conn is the connection the peer speaks on.
	Conn net.Conn
	// Framer writes frames to Conn, illegal ones included.
	Framer *http2.Framer

	t      testing.TB
	cfg    Config
	enc    *hpack.Encoder
	hbuf   bytes.Buffer
	frames chan Frame
	done   chan struct{}

	mu   sync.Mutex
	recv map[uint32]int // DATA payload bytes received per stream
}

// Frame is a copy of a received frame.
type Frame struct {
	Type   http2.FrameType
	Flags  http2.Flags
	Stream uint32
	Code   http2.ErrCode // RST_STREAM, GOAWAY
	Last   uint32        // GOAWAY
	Incr   uint32        // WINDOW_UPDATE
	Data   []byte        // DATA, PING
	Fields []hpack.HeaderField
}

// Header returns the value of the header field name, or "".
func (f Frame) Header(name string) string {
	for _, h := range f.Fields {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

// NewPeer starts a peer on c: it sends nothing yet, and its reader runs
// until c closes. Cleanup closes c and waits for the reader.
func NewPeer(t testing.TB, c net.Conn, cfg Config) *Peer {
	p := &Peer{t: t, Conn: c, cfg: cfg, frames: make(chan Frame, 1<<14), done: make(chan struct{}), recv: map[uint32]int{}}
	p.Framer = http2.NewFramer(c, nil)
	p.Framer.AllowIllegalWrites = true
	p.enc = hpack.NewEncoder(&p.hbuf)
	fr := http2.NewFramer(nil, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	if cfg.MaxReadFrameSize != 0 {
		fr.SetMaxReadFrameSize(cfg.MaxReadFrameSize)
	}
	go p.readLoop(fr)
	t.Cleanup(p.Close)
	return p
}

// Close closes the connection and waits for the reader.
func (p *Peer) Close() {
	p.Conn.Close()
	<-p.done
}

// Frames returns the received frames not yet taken by Want; it is closed
// when the connection ends.
func (p *Peer) Frames() <-chan Frame { return p.frames }

func (p *Peer) readLoop(fr *http2.Framer) {
	defer close(p.done)
	defer close(p.frames)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		rf := Frame{Type: f.Header().Type, Flags: f.Header().Flags, Stream: f.Header().StreamID}
		switch f := f.(type) {
		case *http2.DataFrame:
			rf.Data = append([]byte(nil), f.Data()...)
			p.mu.Lock()
			p.recv[rf.Stream] += len(rf.Data)
			p.mu.Unlock()
		case *http2.MetaHeadersFrame:
			rf.Type = http2.FrameHeaders
			rf.Fields = append([]hpack.HeaderField(nil), f.Fields...)
		case *http2.RSTStreamFrame:
			rf.Code = f.ErrCode
		case *http2.GoAwayFrame:
			rf.Code, rf.Last = f.ErrCode, f.LastStreamID
		case *http2.WindowUpdateFrame:
			rf.Incr = f.Increment
		case *http2.PingFrame:
			rf.Data = append([]byte(nil), f.Data[:]...)
		}
		select {
		case p.frames <- rf:
		default: // a flood's answers the test does not inspect; keep reading
		}
	}
}

// Received returns the DATA payload bytes received so far on stream id,
// whether or not a test read those frames.
func (p *Peer) Received(id uint32) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.recv[id]
}

// Handshake plays the client: it sends the client preface and settings,
// waits for the server's SETTINGS and acknowledges them.
func (p *Peer) Handshake(settings ...http2.Setting) {
	p.t.Helper()
	if _, err := p.Conn.Write([]byte(http2.ClientPreface)); err != nil {
		p.t.Fatal(err)
	}
	p.Must(p.Framer.WriteSettings(settings...))
	p.Want(func(f Frame) bool { return f.Type == http2.FrameSettings && !f.Flags.Has(http2.FlagSettingsAck) })
	p.Must(p.Framer.WriteSettingsAck())
}

// Must fails the test if a write returned err.
func (p *Peer) Must(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("raw peer write: %v", err)
	}
}
