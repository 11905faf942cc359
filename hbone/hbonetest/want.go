package hbonetest

import (
	"time"

	"golang.org/x/net/http2"
)

// Want reads frames until match accepts one and returns it; it fails on
// timeout or when the connection closes first.
func (p *Peer) Want(match func(Frame) bool) Frame {
	p.t.Helper()
	timeout := time.After(p.cfg.wait())
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				p.t.Fatalf("connection closed before the expected frame")
			}
			if match(f) {
				return f
			}
		case <-timeout:
			p.t.Fatalf("timed out waiting for a frame")
		}
	}
}

// WantRST waits for RST_STREAM on stream id (failing on GOAWAY first) and
// checks its code.
func (p *Peer) WantRST(id uint32, code http2.ErrCode) {
	p.t.Helper()
	f := p.Want(func(f Frame) bool {
		return f.Type == http2.FrameGoAway || f.Type == http2.FrameRSTStream && f.Stream == id
	})
	if f.Type != http2.FrameRSTStream || f.Code != code {
		p.t.Fatalf("got %v (code %v) on stream %d, want RST_STREAM %v", f.Type, f.Code, f.Stream, code)
	}
}

// WantGoAway waits for GOAWAY and checks its code; the connection may stay
// open.
func (p *Peer) WantGoAway(code http2.ErrCode) Frame {
	p.t.Helper()
	f := p.Want(func(f Frame) bool { return f.Type == http2.FrameGoAway })
	if f.Code != code {
		p.t.Fatalf("GOAWAY code %v, want %v", f.Code, code)
	}
	return f
}

// WantShutdown waits for GOAWAY, checks its code, and then waits for the
// connection to close.
func (p *Peer) WantShutdown(code http2.ErrCode) Frame {
	p.t.Helper()
	f := p.WantGoAway(code)
	p.WantClosed()
	return f
}

// WantClosed waits until the other side closes the connection.
func (p *Peer) WantClosed() {
	p.t.Helper()
	timeout := time.After(p.cfg.closeWait())
	for {
		select {
		case _, ok := <-p.frames:
			if !ok {
				return
			}
		case <-timeout:
			p.t.Fatalf("connection not closed")
		}
	}
}

// WantStatus waits for the response HEADERS on stream id (failing on a
// reset or GOAWAY first) and checks its :status.
func (p *Peer) WantStatus(id uint32, status string) Frame {
	p.t.Helper()
	f := p.Want(func(f Frame) bool {
		return f.Type == http2.FrameGoAway || f.Stream == id && (f.Type == http2.FrameHeaders || f.Type == http2.FrameRSTStream)
	})
	if f.Type != http2.FrameHeaders || f.Header(":status") != status {
		p.t.Fatalf("got %v (code %v, status %q) on stream %d, want :status %s", f.Type, f.Code, f.Header(":status"), id, status)
	}
	return f
}

// WantEnd waits for the other side to end stream id (END_STREAM on DATA or
// HEADERS), failing on a reset or GOAWAY first.
func (p *Peer) WantEnd(id uint32) {
	p.t.Helper()
	f := p.Want(func(f Frame) bool {
		return f.Type == http2.FrameGoAway || f.Stream == id && (f.Type == http2.FrameRSTStream || f.Flags.Has(http2.FlagDataEndStream))
	})
	if f.Type == http2.FrameGoAway || f.Type == http2.FrameRSTStream {
		p.t.Fatalf("got %v (code %v) on stream %d, want it ended", f.Type, f.Code, id)
	}
}

// WantData collects stream id's DATA until it holds n bytes and returns
// them; it fails on RST_STREAM (on any stream) or timeout. Other frames,
// HEADERS on id included, are skipped.
func (p *Peer) WantData(id uint32, n int) []byte {
	p.t.Helper()
	var got []byte
	for len(got) < n {
		f := p.Want(func(f Frame) bool {
			return f.Type == http2.FrameData && f.Stream == id || f.Type == http2.FrameRSTStream
		})
		if f.Type == http2.FrameRSTStream {
			p.t.Fatalf("RST_STREAM %v on stream %d while waiting for DATA", f.Code, f.Stream)
		}
		got = append(got, f.Data...)
	}
	return got
}
