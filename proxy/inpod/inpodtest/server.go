// Package inpodtest is a fake istio-cni for tests: a ZDS server (SPEC §9)
// on a real unix SOCK_SEQPACKET listener that speaks the protocol as
// istio-cni's node agent does — one protobuf per datagram, the pod netns fd
// attached to AddWorkload by SCM_RIGHTS, one Ack awaited per request for at
// most 5s.
//
// A test makes a Server, points an inpod.Manager's Config.Path at
// Server.Path, and drives each connection by hand:
//
//	srv := inpodtest.NewServer(t, path)
//	c, err := srv.Accept(ctx) // the Manager connected and said hello
//	ackErr, err := c.Add("uid-1", inpod.WorkloadInfo{Name: "a"}, int(nsFile.Fd()))
//	ackErr, err = c.SnapshotSent()
package inpodtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/zdsapi"

	"github.com/gozt/gozt/proxy/inpod"
)

// Timeout is how long the fake waits for ztunnel's hello after a connection
// and for the Ack after a request, as istio-cni does.
const Timeout = 5 * time.Second

// readBufSize is larger than ztunnel may send, so that an oversized
// message shows as an error rather than being cut.
const readBufSize = 64 << 10

// Server is a fake istio-cni ZDS server.
type Server struct {
	path string
	l    *net.UnixListener

	mu     sync.Mutex
	conns  []*Conn
	closed bool
}

// NewServer listens on path (removing a stale socket first, as istio-cni
// does). The test's cleanup closes the Server.
func NewServer(tb testing.TB, path string) *Server {
	tb.Helper()
	s, err := Listen(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Listen is NewServer for a program without a testing.TB (gozt bench's
// node scenario plays istio-cni with it); the caller closes the Server.
func Listen(path string) (*Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("inpodtest: remove stale socket: %w", err)
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("inpodtest: listen %s: %w", path, err)
	}
	return &Server{path: path, l: l}, nil
}

// Path returns the socket path.
func (s *Server) Path() string { return s.path }

// Close stops listening (removing the socket file) and closes every
// accepted connection. It may be called more than once.
func (s *Server) Close() {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if !already {
		s.l.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// Accept waits for the next ztunnel connection, bounded by ctx, and reads
// its ZdsHello, which must say V1 and arrive within Timeout.
func (s *Server) Accept(ctx context.Context) (*Conn, error) {
	uc, err := s.acceptUnix(ctx)
	if err != nil {
		return nil, err
	}
	c := &Conn{uc: uc}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		uc.Close()
		return nil, net.ErrClosed
	}
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	if err := c.readHello(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// acceptUnix accepts one connection, giving up when ctx is done.
func (s *Server) acceptUnix(ctx context.Context) (*net.UnixConn, error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
			s.l.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	})
	uc, err := s.l.AcceptUnix()
	close(done)
	wg.Wait()
	s.l.SetDeadline(time.Time{})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("inpodtest: accept: %w", ctx.Err())
		}
		return nil, fmt.Errorf("inpodtest: accept: %w", err)
	}
	return uc, nil
}

// Conn is one ztunnel connection. Its methods are for one goroutine.
type Conn struct {
	uc *net.UnixConn
}

// readHello reads and checks ztunnel's first message.
func (c *Conn) readHello() error {
	b, err := c.read(Timeout)
	if err != nil {
		return fmt.Errorf("inpodtest: read hello: %w", err)
	}
	var h zdsapi.ZdsHello
	if err := proto.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("inpodtest: decode hello: %w", err)
	}
	if h.GetVersion() != zdsapi.Version_V1 {
		return fmt.Errorf("inpodtest: hello version %v, want V1", h.GetVersion())
	}
	return nil
}

// Add sends AddWorkload for uid with netnsFD attached and returns the Ack's
// error text ("" for success).
func (c *Conn) Add(uid string, info inpod.WorkloadInfo, netnsFD int) (ackError string, err error) {
	return c.Request(AddRequest(uid, info), netnsFD)
}

// Keep sends KeepWorkload for uid and returns the Ack's error text.
func (c *Conn) Keep(uid string) (string, error) {
	return c.Request(&zdsapi.WorkloadRequest{
		Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: uid}},
	})
}

// Del sends DelWorkload for uid and returns the Ack's error text.
func (c *Conn) Del(uid string) (string, error) {
	return c.Request(&zdsapi.WorkloadRequest{
		Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: uid}},
	})
}

// SnapshotSent sends SnapshotSent and returns the Ack's error text.
func (c *Conn) SnapshotSent() (string, error) {
	return c.Request(&zdsapi.WorkloadRequest{
		Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}},
	})
}

// AddRequest returns the AddWorkload request for uid and info.
func AddRequest(uid string, info inpod.WorkloadInfo) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{
		Uid: uid,
		WorkloadInfo: &zdsapi.WorkloadInfo{
			Name:           info.Name,
			Namespace:      info.Namespace,
			ServiceAccount: info.ServiceAccount,
		},
	}}}
}

// Request sends req with fds attached and returns the Ack's error text.
func (c *Conn) Request(req *zdsapi.WorkloadRequest, fds ...int) (string, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("inpodtest: marshal: %w", err)
	}
	if err := c.SendRaw(b, fds...); err != nil {
		return "", err
	}
	return c.ReadAck()
}

// SendRaw sends b as one datagram with fds attached by SCM_RIGHTS.
func (c *Conn) SendRaw(b []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := c.uc.SetWriteDeadline(time.Now().Add(Timeout)); err != nil {
		return fmt.Errorf("inpodtest: send: %w", err)
	}
	if _, _, err := c.uc.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("inpodtest: send: %w", err)
	}
	return nil
}

// ReadAck reads one WorkloadResponse, waiting at most Timeout, and returns
// its Ack's error text. A response that is not an Ack is an error.
func (c *Conn) ReadAck() (string, error) {
	b, err := c.read(Timeout)
	if err != nil {
		return "", fmt.Errorf("inpodtest: read ack: %w", err)
	}
	var resp zdsapi.WorkloadResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		return "", fmt.Errorf("inpodtest: decode ack: %w", err)
	}
	if resp.GetAck() == nil {
		return "", fmt.Errorf("inpodtest: response %v is not an ack", &resp)
	}
	return resp.GetAck().GetError(), nil
}

// CheckAlive is istio-cni's liveness probe: a read of at most d that must
// time out. It returns nil if ztunnel is connected and silent, an error
// wrapping io.EOF if it hung up, and another error if it sent anything.
func (c *Conn) CheckAlive(d time.Duration) error {
	b, err := c.read(d)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	case err != nil:
		return fmt.Errorf("inpodtest: check alive: %w", err)
	default:
		return fmt.Errorf("inpodtest: check alive: unexpected %d-byte message", len(b))
	}
}

// WaitClosed waits up to Timeout for ztunnel to close the connection; it
// returns an error if a message arrives or the connection stays open.
func (c *Conn) WaitClosed() error {
	b, err := c.read(Timeout)
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return fmt.Errorf("inpodtest: wait closed: %w", err)
	default:
		return fmt.Errorf("inpodtest: wait closed: unexpected %d-byte message", len(b))
	}
}

// Close closes the connection, as istio-cni going away does.
func (c *Conn) Close() { c.uc.Close() }

// read reads one datagram within d. Descriptors are not expected from
// ztunnel and count as an error.
func (c *Conn) read(d time.Duration) ([]byte, error) {
	if err := c.uc.SetReadDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	buf := make([]byte, readBufSize)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	if oobn > 0 {
		return nil, errors.New("message with control data")
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, errors.New("truncated message")
	}
	return buf[:n], nil
}
