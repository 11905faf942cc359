package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/zdsapi"

	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
)

// bareRole is the floor of the node scenario's add latency: a program that
// answers istio-cni's ZDS requests doing only what any node proxy must
// for an Add, entering the pod's network namespace (netns.Handle, as gozt
// does) and opening the sockets gozt opens there, with the same options:
// TCP listeners on 15001, 15006 and 15008, the DNS proxy's UDP and TCP
// sockets on 127.0.0.1:15053 and [::1]:15053, and with --socks5 (gozt's
// UNSTABLE_ENABLE_SOCKS5) a TCP listener on 127.0.0.1:15080. It serves
// nothing on them, logs nothing and fetches no certificate. The node
// scenario checks that a pod's namespace holds the same listening sockets
// after either's Add (podSockets).
type bareRole struct {
	noCommands
	socks5 bool
	conn   *net.UnixConn
	done   chan struct{} // closed when serve has returned

	mu   sync.Mutex
	pods map[string][]io.Closer
	err  error // serve's failure, or nil
}

func startBare(_ context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("bare-pods", flag.ContinueOnError)
	path := fs.String("zds", "", "istio-cni's ZDS socket `PATH`")
	socks5 := fs.Bool("socks5", false, "also open the SOCKS5 listener, as gozt does with UNSTABLE_ENABLE_SOCKS5=true")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: *path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	b := &bareRole{socks5: *socks5, conn: c, done: make(chan struct{}), pods: map[string][]io.Closer{}}
	if err := b.send(&zdsapi.ZdsHello{Version: zdsapi.Version_V1}); err != nil {
		c.Close()
		return nil, err
	}
	go b.serve()
	return b, nil
}

func (b *bareRole) send(m proto.Message) error {
	out, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	_, err = b.conn.Write(out)
	return err
}

// serve answers requests until the connection ends.
func (b *bareRole) serve() {
	defer close(b.done)
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := b.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				b.fail(err)
			}
			return
		}
		var req zdsapi.WorkloadRequest
		if err := proto.Unmarshal(buf[:n], &req); err != nil {
			b.fail(err)
			return
		}
		msg := ""
		if err := b.handle(&req, oob[:oobn]); err != nil {
			msg = err.Error()
		}
		if err := b.send(&zdsapi.WorkloadResponse{Payload: &zdsapi.WorkloadResponse_Ack{Ack: &zdsapi.Ack{Error: msg}}}); err != nil {
			b.fail(err)
			return
		}
	}
}

func (b *bareRole) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = err
	}
}

// handle carries out one request.
func (b *bareRole) handle(req *zdsapi.WorkloadRequest, oob []byte) error {
	switch p := req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		files := parseRightsFiles(oob)
		if len(files) != 1 {
			for _, f := range files {
				f.Close()
			}
			return fmt.Errorf("add %s: %d descriptors, want 1", p.Add.GetUid(), len(files))
		}
		ns, err := netns.New(files[0])
		if err != nil {
			return err
		}
		socks, err := openPodSockets(ns, b.socks5)
		ns.Close()
		if err != nil {
			return err
		}
		b.mu.Lock()
		old := b.pods[p.Add.GetUid()]
		b.pods[p.Add.GetUid()] = socks
		b.mu.Unlock()
		closeClosers(old)
	case *zdsapi.WorkloadRequest_Del:
		b.mu.Lock()
		old := b.pods[p.Del.GetUid()]
		delete(b.pods, p.Del.GetUid())
		b.mu.Unlock()
		closeClosers(old)
	}
	return nil
}

// podMark is gozt's default PACKET_MARK in shared mode.
const podMark = 1337

// openPodSockets opens, inside ns, the sockets gozt opens for a pod, the
// SOCKS5 listener too if socks5.
func openPodSockets(ns *netns.Handle, socks5 bool) ([]io.Closer, error) {
	var out []io.Closer
	err := ns.Run(func() error {
		tcp := sockopt.ListenConfig(sockopt.Options{Transparent: true, ReusePort: true, Mark: podMark})
		for _, port := range []string{"15001", "15006", "15008"} {
			l, err := tcp.Listen(context.Background(), "tcp", "0.0.0.0:"+port)
			if err != nil {
				return err
			}
			out = append(out, l)
		}
		// The SOCKS5 listener and the DNS proxy's sockets: loopback, not
		// transparent.
		local := sockopt.ListenConfig(sockopt.Options{ReusePort: true, Mark: podMark})
		if socks5 {
			l, err := local.Listen(context.Background(), "tcp", "127.0.0.1:15080")
			if err != nil {
				return err
			}
			out = append(out, l)
		}
		for _, addr := range []string{"127.0.0.1:15053", "[::1]:15053"} {
			pc, err := local.ListenPacket(context.Background(), "udp", addr)
			if err != nil {
				return err
			}
			out = append(out, pc)
			l, err := local.Listen(context.Background(), "tcp", addr)
			if err != nil {
				return err
			}
			out = append(out, l)
		}
		return nil
	})
	if err != nil {
		closeClosers(out)
		return nil, err
	}
	return out, nil
}

func closeClosers(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// parseRightsFiles returns the descriptors of the SCM_RIGHTS messages in
// oob as files.
func parseRightsFiles(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []*os.File
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			out = append(out, os.NewFile(uintptr(fd), "netns"))
		}
	}
	return out
}

func (b *bareRole) info() map[string]string { return map[string]string{} }

func (b *bareRole) stats(m map[string]any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m["pods"] = len(b.pods)
}

func (b *bareRole) close() error {
	b.conn.Close()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, socks := range b.pods {
		closeClosers(socks)
	}
	b.pods = nil
	return b.err
}
