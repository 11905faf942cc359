package hbonetest

import (
	"bytes"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// fragmentSize is the largest header block fragment WriteBlock sends: the
// default SETTINGS_MAX_FRAME_SIZE (RFC 9113 section 6.5.2).
const fragmentSize = 16 << 10

// Block encodes name/value pairs as a header block with the connection's
// HPACK encoder (so repeated fields become indexed references).
func (p *Peer) Block(fields ...string) []byte {
	p.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), p.hbuf.Bytes()...)
}

// Headers writes fields as a header block on stream id, ending the headers:
// in one HEADERS frame, or as WriteBlock does if Config.SplitHeaders is set.
func (p *Peer) Headers(id uint32, endStream bool, fields ...string) {
	p.t.Helper()
	block := p.Block(fields...)
	if p.cfg.SplitHeaders {
		p.WriteBlock(id, endStream, block)
		return
	}
	p.Must(p.Framer.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: block, EndStream: endStream, EndHeaders: true,
	}))
}

// WriteBlock writes block as HEADERS and CONTINUATION frames of at most
// 16 KiB, the last with END_HEADERS, like a peer respecting the default
// frame size.
func (p *Peer) WriteBlock(id uint32, endStream bool, block []byte) {
	p.t.Helper()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), fragmentSize)
		frag := block[:n]
		block = block[n:]
		if first {
			p.Must(p.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0}))
			first = false
		} else {
			p.Must(p.Framer.WriteContinuation(id, len(block) == 0, frag))
		}
	}
}

// Connect writes a CONNECT request for stream id to authority, with extra
// name/value pairs after the pseudo-headers.
func (p *Peer) Connect(id uint32, authority string, extra ...string) {
	p.t.Helper()
	p.Headers(id, false, append([]string{":method", "CONNECT", ":authority", authority}, extra...)...)
}

// Echo sends msg on an open tunnel, reads it back and returns window to the
// other side for it; it fails on a reset or GOAWAY first.
func (p *Peer) Echo(id uint32, msg []byte) {
	p.t.Helper()
	p.Must(p.Framer.WriteData(id, false, msg))
	var got []byte
	for len(got) < len(msg) {
		f := p.Want(func(f Frame) bool {
			return f.Type == http2.FrameGoAway || f.Stream == id && (f.Type == http2.FrameData || f.Type == http2.FrameRSTStream)
		})
		if f.Type != http2.FrameData {
			p.t.Fatalf("got %v (code %v) on stream %d, want DATA", f.Type, f.Code, id)
		}
		got = append(got, f.Data...)
		if len(f.Data) > 0 {
			p.Must(p.Framer.WriteWindowUpdate(0, uint32(len(f.Data))))
			p.Must(p.Framer.WriteWindowUpdate(id, uint32(len(f.Data))))
		}
	}
	if !bytes.Equal(got, msg) {
		p.t.Fatalf("echo on stream %d: %d bytes differ from the %d sent", id, len(got), len(msg))
	}
}
