package hbone

import (
	"errors"
	"fmt"

	"golang.org/x/net/http2"
)

// StatusError reports a CONNECT request answered with a status other than
// 200.
type StatusError struct {
	// Code is the HTTP status the peer answered.
	Code int
}

func (e *StatusError) Error() string { return fmt.Sprintf("hbone: CONNECT answered %d", e.Code) }

// ResetError reports a stream that was reset with an error code other than
// NO_ERROR or CANCEL (those read as EOF), or a write to a stream the peer
// reset with any code.
type ResetError struct {
	// Code is the RST_STREAM error code.
	Code http2.ErrCode
	// Remote reports whether the peer sent the reset (false: we did, because
	// the peer broke the protocol).
	Remote bool
}

func (e *ResetError) Error() string {
	if e.Remote {
		return fmt.Sprintf("hbone: stream reset by peer: %v", e.Code)
	}
	return fmt.Sprintf("hbone: stream reset: %v", e.Code)
}

var (
	// ErrServerClosed is returned by Server.ServeConn after Shutdown or
	// Close.
	ErrServerClosed = errors.New("hbone: server closed")
	// ErrPoolClosed is returned by Pool.Connect after Pool.Close.
	ErrPoolClosed = errors.New("hbone: pool closed")
	// ErrConnClosed is returned by stream and connection operations once the
	// HTTP/2 connection is gone.
	ErrConnClosed = errors.New("hbone: connection closed")
	// ErrNoCapacity is returned by ClientConn.Connect when the connection
	// cannot take a new stream (stream cap reached, GOAWAY sent or received,
	// or closed). Pool.Connect retries on another connection.
	ErrNoCapacity = errors.New("hbone: connection cannot take a new stream")
	// ErrRefused is returned by Connect when the peer refused the stream
	// before processing it (REFUSED_STREAM, or above a GOAWAY's last stream
	// id); the request is safe to retry on another connection.
	ErrRefused = errors.New("hbone: stream refused by peer")

	errPingTimeout    = errors.New("hbone: ping timeout")
	errRespondTwice   = errors.New("hbone: Respond called twice")
	errNotResponded   = errors.New("hbone: stream not answered yet")
	errBadStatus      = errors.New("hbone: invalid response status")
	errStreamClosed   = errors.New("hbone: write after CloseWrite")
	errHeaderTooLarge = errors.New("hbone: response header list too large")
	errMalformed      = errors.New("hbone: malformed response")
	errInvalidHeader  = errors.New("hbone: invalid header field")
	errShutdown       = errors.New("hbone: connection shut down")
	errPushing        = errors.New("hbone: stream bytes are pushed (PushTo)")
)

// connError is a connection error (RFC 9113 §5.4.1): the connection ends
// with a GOAWAY carrying code.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string {
	return fmt.Sprintf("hbone: connection error %v: %s", e.code, e.reason)
}

// retryable reports whether a Connect failure left the request unprocessed,
// so that it may be sent again on another connection.
func retryable(err error) bool {
	return errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrRefused)
}
