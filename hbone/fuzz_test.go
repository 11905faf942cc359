package hbone

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// fuzzSeeds returns client byte streams (after the preface) that exercise
// the main frame types.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	build := func(f func(fr *http2.Framer, enc func(...string) []byte)) {
		var buf, hbuf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		he := hpack.NewEncoder(&hbuf)
		enc := func(kv ...string) []byte {
			hbuf.Reset()
			for i := 0; i+1 < len(kv); i += 2 {
				he.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
			}
			return append([]byte(nil), hbuf.Bytes()...)
		}
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		f(fr, enc)
		seeds = append(seeds, buf.Bytes())
	}
	connect := func(enc func(...string) []byte, id uint32) http2.HeadersFrameParam {
		return http2.HeadersFrameParam{StreamID: id, BlockFragment: enc(":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", "k=v"), EndHeaders: true}
	}
	build(func(fr *http2.Framer, enc func(...string) []byte) {
		fr.WriteHeaders(connect(enc, 1))
		fr.WriteData(1, false, []byte("hello"))
		fr.WriteData(1, true, []byte("world"))
	})
	build(func(fr *http2.Framer, enc func(...string) []byte) {
		fr.WriteHeaders(connect(enc, 1))
		fr.WriteRSTStream(1, http2.ErrCodeCancel)
		fr.WriteHeaders(connect(enc, 3))
		fr.WriteWindowUpdate(3, 1000)
		fr.WriteWindowUpdate(0, 1000)
		fr.WritePing(false, [8]byte{1, 2})
		fr.WriteGoAway(3, http2.ErrCodeNo, nil)
	})
	build(func(fr *http2.Framer, enc func(...string) []byte) {
		b := enc(":method", "CONNECT", ":authority", "a:1", "x-long", string(bytes.Repeat([]byte("z"), 300)))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:10]})
		fr.WriteContinuation(1, false, b[10:20])
		fr.WriteContinuation(1, true, b[20:])
		fr.WriteDataPadded(1, false, []byte("padded"), make([]byte, 7))
		fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 5})
		fr.WriteRawFrame(0x42, 0, 0, []byte("unknown"))
	})
	build(func(fr *http2.Framer, enc func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(":method", "GET", ":path", "/", ":scheme", "https"), EndHeaders: true, EndStream: true})
		fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20})
		fr.WriteHeaders(connect(enc, 5))
		fr.WriteData(5, false, make([]byte, 70000))
	})
	return seeds
}

// FuzzServerFrames feeds arbitrary bytes to a Server as a client would send
// them after the preface: it must neither panic nor hang, and ServeConn must
// return (with all its goroutines) once the client goes away.
func FuzzServerFrames(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		srv := &Server{
			Config: Config{PingInterval: time.Hour},
			Handler: func(s *ServerStream) {
				if s.Method() != http.MethodConnect {
					s.Respond(http.StatusBadRequest, nil)
					return
				}
				s.Respond(http.StatusOK, http.Header{"X": {"y"}})
				defer s.Close()
				buf := make([]byte, 1024)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						s.Write(buf[:n])
					}
					if err != nil {
						s.CloseWrite()
						return
					}
				}
			},
		}
		cn, sn := net.Pipe()
		served := make(chan error, 1)
		go func() { served <- srv.ServeConn(context.Background(), sn) }()
		drained := make(chan struct{})
		go func() {
			io.Copy(io.Discard, cn)
			close(drained)
		}()
		cn.Write([]byte(http2.ClientPreface))
		cn.Write(in)
		// Give the server a moment to act on the input, then hang up.
		time.Sleep(time.Millisecond)
		cn.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the client closed")
		}
		<-drained
	})
}
