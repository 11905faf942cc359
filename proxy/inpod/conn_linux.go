package inpod

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// writeTimeout bounds one write to istio-cni, which itself waits 5s for
// every message (SPEC §9).
const writeTimeout = 5 * time.Second

// zdsConn is a SOCK_SEQPACKET connection to istio-cni: one protobuf per
// datagram, no length prefix. recv is called by one goroutine and send by
// another; close may be called from any.
type zdsConn struct {
	uc *net.UnixConn
}

// dialZDS connects to istio-cni's socket at path.
func dialZDS(ctx context.Context, path string) (*zdsConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, err
	}
	return &zdsConn{uc: c.(*net.UnixConn)}, nil
}

// send writes m as one datagram.
func (c *zdsConn) send(m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal %T: %w", m, err)
	}
	if err := c.uc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return err
	}
	_, err = c.uc.Write(b)
	return err
}

// recv reads one datagram and the descriptors that came with it. The net
// package reads with MSG_CMSG_CLOEXEC, so received fds are close-on-exec.
func (c *zdsConn) recv() datagram {
	buf := make([]byte, recvBufSize)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(buf, oob)
	n, oobn = max(n, 0), max(oobn, 0) // a failed read may say -1
	d := datagram{
		b:         buf[:n],
		msgTrunc:  flags&unix.MSG_TRUNC != 0,
		ctrlTrunc: flags&unix.MSG_CTRUNC != 0,
		err:       err,
	}
	// Even a failed or empty read may have brought descriptors; take them
	// so they get closed.
	if oobn > 0 {
		d.files = parseRights(oob[:oobn])
	}
	return d
}

// parseRights returns the descriptors of every SCM_RIGHTS message in oob.
func parseRights(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "zds-fd"))
		}
	}
	return files
}

// close closes the connection; a blocked recv returns an error.
func (c *zdsConn) close() error { return c.uc.Close() }
