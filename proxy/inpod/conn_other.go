//go:build !linux

package inpod

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// errUnsupported is returned for everything this package cannot do outside
// Linux.
var errUnsupported = fmt.Errorf("inpod: %w: not supported on this OS", errors.ErrUnsupported)

// zdsConn is Linux-only.
type zdsConn struct{}

// dialZDS is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func dialZDS(ctx context.Context, path string) (*zdsConn, error) { return nil, errUnsupported }

func (c *zdsConn) send(m proto.Message) error { return errUnsupported }
func (c *zdsConn) recv() datagram             { return datagram{err: errUnsupported} }
func (c *zdsConn) close() error               { return nil }
