// Package hbone implements HBONE tunnels: HTTP/2 CONNECT streams over an
// established (usually mutual-TLS) connection, as spoken by Istio's ztunnel on
// port 15008 (SPEC §2).
//
// The package owns the HTTP/2 connection in both roles. It is built on
// golang.org/x/net/http2's Framer and hpack rather than on http2.Server or
// http2.Transport, because HBONE needs behaviour those do not offer: streams
// that half-close independently in each direction (http2.Server resets a
// stream whose handler finished while the client still sends), strict limits
// against hostile peers, and a write path without a per-connection writer
// goroutine. It speaks only what HBONE needs: CONNECT streams, SETTINGS,
// WINDOW_UPDATE, PING, GOAWAY, RST_STREAM, DATA and HEADERS+CONTINUATION.
// Priorities, push, trailers and extended CONNECT are not supported.
//
// # Server
//
// A [Server] serves connections handed to [Server.ServeConn] (the caller does
// the TLS handshake). Each request runs its [Handler] on a new goroutine; the
// handler inspects the [ServerStream] (method, authority, headers, the
// underlying connection), calls [ServerStream.Respond] exactly once, and on
// 200 uses the stream as a [net.Conn]:
//
//	srv := &hbone.Server{Handler: func(s *hbone.ServerStream) {
//		if s.Method() != http.MethodConnect {
//			s.Respond(http.StatusBadRequest, nil)
//			return
//		}
//		upstream, err := dial(s.Authority())
//		if err != nil {
//			s.Respond(http.StatusServiceUnavailable, nil)
//			return
//		}
//		s.Respond(http.StatusOK, nil)
//		relay(s, upstream) // copies both ways, CloseWrite on EOF, then Close
//	}}
//	go srv.ServeConn(ctx, tlsConn)
//
// Bytes the client sends before Respond stay buffered in the stream (bounded
// by its flow-control window) and reach nobody until the handler reads them.
//
// # Client
//
// [NewClientConn] starts the client side of a connection; [ClientConn.Connect]
// opens one tunnel. A [Pool] keeps client connections per [Key] (SPEC §3.6):
// one in-flight dial per key, about MaxStreamsPerConn streams per connection,
// idle connections released after IdleTimeout.
// [ClientConn.ConnectEarly] and [Pool.ConnectEarly] also send the tunnel's
// first bytes, read from the downstream connection while the response is
// awaited, right after the request HEADERS and within the peer's initial
// stream window, so a client that speaks first does not wait for the 200;
// the pool keeps them until the response and sends them again when it
// retries a refused stream.
//
// # Streams
//
// [ServerStream] and [ClientStream] implement [net.Conn] plus CloseWrite.
// CloseWrite sends END_STREAM (a TCP FIN on the other side); receiving
// END_STREAM makes Read return [io.EOF] after the buffered bytes. A reset with
// NO_ERROR or CANCEL also reads as EOF; other reset codes surface as
// [*ResetError]. Close resets the stream with CANCEL unless both directions
// already ended. AfterReset reports the peer's reset, which a relay needs
// since a reset read as EOF also ends the write direction.
//
// # Concurrency and flow control
//
// Streams also implement io.WriterTo (received chunks go straight to the
// destination, credit returned once written) and io.ReaderFrom (buffers
// grow with the flow, 1 KiB to 256 KiB), so io.Copy in either direction
// avoids an extra copy. PushTo goes further for a relay: received bytes are
// written to the destination by the connection's reader itself, with one
// non-blocking attempt (the destination's TryWrite), the rest by a
// short-lived drainer goroutine, so an idle pushed stream has no goroutine
// and no buffer. Under TLS, wrapping the TCP connection in a
// [BatchConn] before the handshake lets a flush write several TLS records in
// one system call.
//
// Frames are written under a per-connection lock by the goroutine that has
// them (the application's), through a write buffer flushed when no other
// writer waits. The connection's reader never blocks on that lock: the frames
// it must send (SETTINGS and PING acknowledgements, WINDOW_UPDATE, RST_STREAM)
// are queued for a small per-connection flusher, so two peers with full
// sockets keep reading and cannot deadlock. Stream window credit is returned
// only as the application reads, so a stream nobody reads holds at most its
// stream window; connection credit for streams that were answered 200 is
// returned on receipt (up to a per-connection cap of buffered bytes), so such a
// stream does not stall its siblings.
package hbone
