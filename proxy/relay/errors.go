package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// isBenign reports whether err is how connections normally end rather than a
// failure worth reporting: the peer reset the connection or stopped reading
// (ECONNRESET, EPIPE, ECONNABORTED, ENOTCONN), a conn was closed under the
// copy (net.ErrClosed, io.ErrClosedPipe), or a TLS peer went away in the
// middle of a record (io.ErrUnexpectedEOF). ztunnel ignores the same kinds
// at the end of a copy (src/copy.rs, ignore_io_errors); SPEC §2.8, STYLE 18.
func isBenign(err error) bool {
	return errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.ENOTCONN)
}

// Internal outcomes of a sockReader's read, never returned by the package:
// errWouldBlock is a read that found nothing and was told not to wait,
// errIdle a brief wait (half.readBriefly) that saw no byte.
var (
	errWouldBlock = errors.New("relay: nothing to read yet")
	errIdle       = errors.New("relay: idle")
)
