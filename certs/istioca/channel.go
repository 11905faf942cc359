package istioca

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// errClosed: Issue after Close.
var errClosed = errors.New("client closed")

// connect returns the channel to send a call on, after one connection
// attempt if it had no connection: it returns once the channel is ready,
// or the attempt failed (the call then fails at once with the connection
// error), or ctx ended (the call then reports that).
//
// A gRPC channel whose connection attempts failed stays in
// TRANSIENT_FAILURE until one succeeds (gRFC A62 "sticky" failure), fails
// calls at once meanwhile, and retries only on its own backoff (up to
// 120s). So a CA that came back would be seen only at the channel's next
// attempt, however soon the certificate manager retries (TESTPLAN F8). A
// failed channel is therefore replaced by a new one, and every request
// after a failure makes a fresh attempt, as ztunnel's does; the manager's
// per-identity backoff paces them.
func (c *Client) connect(ctx context.Context) (*grpc.ClientConn, error) {
	for {
		conn, err := c.channel()
		if err != nil {
			return nil, err
		}
		if !waitAttempt(ctx, conn) {
			return conn, nil
		}
		// conn was replaced by a concurrent Issue (or closed): again.
	}
}

// waitAttempt waits until conn is ready or its connection attempt failed
// or ctx ends, starting an attempt if conn is idle. It reports whether conn
// was shut down meanwhile.
func waitAttempt(ctx context.Context, conn *grpc.ClientConn) (shutdown bool) {
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready, connectivity.TransientFailure:
			return false
		case connectivity.Shutdown:
			return true
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, s) {
			return false
		}
	}
}

// channel returns the current channel, first replacing it with a new one if
// it is in TRANSIENT_FAILURE.
func (c *Client) channel() (*grpc.ClientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	old := c.conn
	if old.GetState() != connectivity.TransientFailure {
		c.mu.Unlock()
		return old, nil
	}
	conn, err := grpc.NewClient(c.target, c.opts...)
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	c.conn = conn
	c.mu.Unlock()
	// A failed channel fails calls at once; a call that connect handed old
	// and that starts only now fails with Canceled, and Issue sends it
	// again on conn (create).
	old.Close()
	return conn, nil
}

// Close closes the gRPC connection. Issue calls after Close fail.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("istioca: close: %w", err)
	}
	return nil
}
