//lint:file-ignore SA1019 x/net's http2.Server (deprecated in favour of net/http) is deliberately the reference HTTP/2 server here.

package hbone

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gozt/gozt/hbone/hbonetest"
	"golang.org/x/net/http2"
)

// Stream-state conformance (RFC 9113 §5.1, §6.1, §8.1, §8.3.1, §8.5): each
// case drives a frame-level client against our Server and against x/net's
// http2.Server with handlers that behave alike, expects the outcome the RFC
// names from both (x/net is the reference that the expectation is right),
// and then checks that the connection still serves a new stream.

// conformAuthority selects the handlers' behaviour for a CONNECT: "hold"
// answers 200, reads to EOF and keeps the stream open; "close" answers 200,
// reads to EOF and ends its side. Other methods read the body to EOF and
// answer 400.
const (
	conformHold  = "hold:1"
	conformClose = "close:1"
)

func conformGozt(t *testing.T) *hbonetest.Peer {
	release := make(chan struct{})
	r, _ := rawServer(t, &Server{Handler: func(s *ServerStream) {
		if s.Method() != http.MethodConnect {
			io.Copy(io.Discard, s)
			s.Respond(http.StatusBadRequest, nil)
			return
		}
		if err := s.Respond(http.StatusOK, nil); err != nil {
			return
		}
		io.Copy(io.Discard, s)
		if s.Authority() == conformClose {
			s.CloseWrite()
			return
		}
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		s.Close()
	}})
	t.Cleanup(func() { close(release) }) // before rawServer's cleanup waits for handlers
	r.Handshake()
	return r
}

func conformXNet(t *testing.T) *hbonetest.Peer {
	cn, sn := connPair(t, false)
	srv := &http2.Server{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeConn(sn, &http2.ServeConnOpts{Context: ctx, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method != http.MethodConnect {
				io.Copy(io.Discard, req.Body)
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			io.Copy(io.Discard, req.Body)
			if req.Host == conformClose {
				return
			}
			select {
			case <-req.Context().Done():
			case <-time.After(30 * time.Second):
			}
		})})
	}()
	t.Cleanup(func() {
		cancel()
		sn.Close()
		<-done
	})
	r := hbonetest.NewPeer(t, cn, hbonetest.Config{})
	r.Handshake()
	return r
}

func TestStreamStateConformance(t *testing.T) {
	cases := []struct {
		name string
		run  func(r *hbonetest.Peer)
		// xnet is false where x/net's server does not keep the rule (the
		// reason follows); the case then runs against ours only.
		xnet bool
	}{
		{"HEADERS on a half-closed (remote) stream: STREAM_CLOSED", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "CONNECT", ":authority", conformHold)
			r.WantStatus(1, "200")
			r.Must(r.Framer.WriteData(1, true, []byte("x")))
			r.Headers(1, true, "x-trailer", "1")
			r.WantRST(1, http2.ErrCodeStreamClosed)
		}, true},
		{"DATA after END_STREAM: STREAM_CLOSED", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "CONNECT", ":authority", conformHold)
			r.WantStatus(1, "200")
			r.Must(r.Framer.WriteData(1, true, []byte("x")))
			r.Must(r.Framer.WriteData(1, false, []byte("y")))
			r.WantRST(1, http2.ErrCodeStreamClosed)
		}, true},
		{"DATA on a closed stream: STREAM_CLOSED", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "CONNECT", ":authority", conformClose)
			r.WantStatus(1, "200")
			r.Must(r.Framer.WriteData(1, true, []byte("x")))
			r.WantEnd(1)
			r.Must(r.Framer.WriteData(1, false, []byte("late")))
			r.WantRST(1, http2.ErrCodeStreamClosed)
		}, true},
		{"DATA after the client's RST_STREAM: STREAM_CLOSED", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "CONNECT", ":authority", conformHold)
			r.WantStatus(1, "200")
			r.Must(r.Framer.WriteRSTStream(1, http2.ErrCodeCancel))
			r.Must(r.Framer.WriteData(1, false, []byte("late")))
			r.WantRST(1, http2.ErrCodeStreamClosed)
		}, true},
		{"non-CONNECT with an empty :path: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, true, ":method", "GET", ":scheme", "https", ":path", "", ":authority", "x")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, true},
		{"non-CONNECT without :path: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, true, ":method", "GET", ":scheme", "https", ":authority", "x")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, true},
		{"non-CONNECT without :scheme: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, true, ":method", "GET", ":path", "/", ":authority", "x")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, true},
		{"trailers on a non-CONNECT request: the handler's answer", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "POST", ":scheme", "https", ":path", "/", ":authority", "x")
			r.Must(r.Framer.WriteData(1, false, []byte("body")))
			r.Headers(1, true, "x-trailer", "1")
			r.WantStatus(1, "400")
		}, true},
		{"trailers without END_STREAM: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "POST", ":scheme", "https", ":path", "/", ":authority", "x")
			r.Headers(1, false, "x-trailer", "1")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, true},
		{"trailers with a pseudo-header: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "POST", ":scheme", "https", ":path", "/", ":authority", "x")
			r.Headers(1, true, ":path", "/again")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, true},
		// x/net's server takes trailers on a CONNECT stream like on any
		// request; RFC 9113 §8.5 allows only DATA and stream management
		// frames on a tunnel.
		{"trailers on a tunnel: PROTOCOL_ERROR", func(r *hbonetest.Peer) {
			r.Headers(1, false, ":method", "CONNECT", ":authority", conformHold)
			r.WantStatus(1, "200")
			r.Headers(1, true, "x-trailer", "1")
			r.WantRST(1, http2.ErrCodeProtocol)
		}, false},
	}
	for _, tc := range cases {
		servers := map[string]func(*testing.T) *hbonetest.Peer{"gozt": conformGozt}
		if tc.xnet {
			servers["x-net"] = conformXNet
		}
		for name, start := range servers {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				r := start(t)
				tc.run(r)
				// The connection lives on: a new tunnel opens.
				r.Headers(3, false, ":method", "CONNECT", ":authority", conformHold)
				r.WantStatus(3, "200")
			})
		}
	}
}

// TestClosedStreamDataAnsweredOnce: DATA frames in a row on one closed
// stream get one STREAM_CLOSED, and a flood of them across closed streams
// ends the connection rather than queueing answers without bound.
func TestClosedStreamDataAnsweredOnce(t *testing.T) {
	r := conformGozt(t)
	r.Headers(1, false, ":method", "CONNECT", ":authority", conformHold)
	r.WantStatus(1, "200")
	r.Must(r.Framer.WriteRSTStream(1, http2.ErrCodeCancel))
	for range 5 {
		r.Must(r.Framer.WriteData(1, false, []byte("late")))
	}
	r.Must(r.Framer.WritePing(false, [8]byte{1}))
	rsts := 0
	for {
		f := r.Want(func(f hbonetest.Frame) bool {
			return f.Type == http2.FrameRSTStream || f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck)
		})
		if f.Type == http2.FramePing {
			break
		}
		rsts++
	}
	if rsts != 1 {
		t.Errorf("%d RST_STREAMs for five DATA frames on one closed stream, want 1", rsts)
	}

	// Open and reset streams, then alternate DATA between two of them, so
	// that every frame asks for an answer.
	var ids []uint32
	for id := uint32(3); id < 3+2*4; id += 2 {
		r.Headers(id, false, ":method", "CONNECT", ":authority", conformHold)
		r.WantStatus(id, "200")
		r.Must(r.Framer.WriteRSTStream(id, http2.ErrCodeCancel))
		ids = append(ids, id)
	}
	for i := 0; i < maxClosedFrames+10; i++ {
		if err := r.Framer.WriteData(ids[i%len(ids)], false, []byte{0}); err != nil {
			break // the server closed the connection
		}
	}
	r.WantGoAway(http2.ErrCodeEnhanceYourCalm)
}
