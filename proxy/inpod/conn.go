package inpod

import "os"

// Wire limits of SPEC §9.
const (
	// recvBufSize is ztunnel's receive buffer; a longer datagram is an
	// error.
	recvBufSize = 1024
	// maxFDs is how many descriptors one datagram may carry before its
	// control data is truncated (an Add carries exactly one; the rest is
	// room to see and close extras).
	maxFDs = 8
)

// datagram is one message read from the ZDS socket.
type datagram struct {
	b         []byte
	files     []*os.File // received by SCM_RIGHTS; whoever takes the datagram closes or keeps them
	msgTrunc  bool       // the message was longer than recvBufSize
	ctrlTrunc bool       // the control data (fds) did not fit
	err       error      // read error: the connection is over
}

// closeFiles closes every received descriptor.
func (d *datagram) closeFiles() {
	closeFiles(d.files)
	d.files = nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// readLoop reads datagrams from c and sends them to out until a read fails;
// it sends that failure too, then closes out. Whoever owns out reads it
// until it is closed.
func readLoop(c *zdsConn, out chan<- datagram) {
	defer close(out)
	for {
		d := c.recv()
		out <- d
		if d.err != nil {
			return
		}
	}
}
