package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/proxy/netns"
	"github.com/gozt/gozt/proxy/sockopt"
)

// nodeBench is the node scenario's setup (node.go): the namespaces, the
// fake istiod, the pods' test servers and the gozt binary.
type nodeBench struct {
	e      *env
	dir    string // sockets and files
	gozt   string // the gozt binary
	nodeNS *os.File
	node   *netns.Handle // the harness's way into the node's namespace
	istiod *child
	pods   []*nodePod
	apps   connServer
	env    []string     // gozt's environment, but INPOD_UDS
	web    *http.Client // reaches gozt's admin and metrics ports
}

// nodePod is one pod: its namespace, handed to gozt on every Add, and the
// harness's way into it.
type nodePod struct {
	i     int
	ns    *os.File
	netns *netns.Handle
}

func (p *nodePod) info() inpod.WorkloadInfo {
	return inpod.WorkloadInfo{Name: nodePodName(p.i), Namespace: nodePodNS, ServiceAccount: nodePodSA(p.i)}
}

// openNetns returns an netns.Handle of its own for the namespace f holds.
func openNetns(f *os.File) (*netns.Handle, error) {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return netns.New(os.NewFile(uintptr(fd), f.Name()))
}

func (e *env) newNodeBench(ctx context.Context, pods int) (nb *nodeBench, err error) {
	nb = &nodeBench{e: e, dir: filepath.Join(e.tmp, "node")}
	defer func() {
		if err != nil {
			nb.close()
		}
	}()
	if err := os.MkdirAll(nb.dir, 0o755); err != nil {
		return nil, err
	}
	if nb.gozt, err = e.goztBinary(ctx); err != nil {
		return nil, err
	}
	if nb.nodeNS, err = newNetns(); err != nil {
		return nil, err
	}
	if nb.node, err = openNetns(nb.nodeNS); err != nil {
		return nil, err
	}
	pem := filepath.Join(nb.dir, "istiod.pem")
	nb.istiod, err = e.roleWith(ctx, "istiod", "xds", inNetnsOf(nb.nodeNS, e.exe), "--ca-out", pem, "--ca",
		"--pods", fmt.Sprint(pods), "--pod-node", nodeName, "--clients", "1", "--low-priority")
	if err != nil {
		return nil, err
	}
	nb.env = []string{
		"NODE_NAME=" + nodeName,
		"XDS_ADDRESS=" + nb.istiod.info["addr"],
		"CA_ADDRESS=" + nb.istiod.info["ca_addr"],
		"XDS_ROOT_CA=" + pem,
		"CA_ROOT_CA=" + pem,
		"AUTH_TOKEN=bench-token",
		"UNSTABLE_ENABLE_SOCKS5=true",
	}
	for i := range pods {
		if err := nb.addPod(i); err != nil {
			return nil, fmt.Errorf("pod %d: %w", i, err)
		}
	}
	nb.web = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return sockopt.DialInNetns(ctx, nb.node.Enter, &net.Dialer{}, ap)
		},
	}}
	return nb, nil
}

// addPod makes pod i's namespace and starts its test server there.
func (nb *nodeBench) addPod(i int) (err error) {
	p := &nodePod{i: i}
	if p.ns, err = newNetns(); err != nil {
		return err
	}
	if p.netns, err = openNetns(p.ns); err != nil {
		p.ns.Close()
		return err
	}
	nb.pods = append(nb.pods, p)
	var l net.Listener
	err = p.netns.Run(func() (err error) {
		l, err = net.Listen("tcp", ap(nodePodIP(i), appPort).String())
		return err
	})
	if err != nil {
		return err
	}
	var app appRole
	nb.apps.serve(l, app.handle)
	return nil
}

func (nb *nodeBench) close() {
	nb.apps.close()
	if nb.istiod != nil {
		nb.istiod.stop()
	}
	for _, p := range nb.pods {
		p.netns.Close()
		p.ns.Close()
	}
	if nb.node != nil {
		nb.node.Close()
	}
	if nb.nodeNS != nil {
		nb.nodeNS.Close()
	}
}

// goztBinary returns the gozt binary of --gozt, or builds cmd/gozt into
// the run's directory (the harness runs from the module, as `make bench`
// does).
func (e *env) goztBinary(ctx context.Context) (string, error) {
	if e.opts.goztBin != "" {
		return e.opts.goztBin, nil
	}
	out := filepath.Join(e.tmp, "gozt")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/gozt/gozt/cmd/gozt")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build gozt (or pass --gozt): %w\n%s", err, b)
	}
	return out, nil
}

// startGozt runs `gozt proxy` in the node's namespace, its ZDS socket at
// zds, and returns the process; it has not connected yet. env is added to
// its environment.
func (nb *nodeBench) startGozt(label, zds string, env ...string) (*child, error) {
	cmd := exec.Command(nb.gozt, "proxy")
	c := newChild(label, cmd)
	cmd.Env = append(os.Environ(), nb.env...)
	cmd.Env = append(cmd.Env, "INPOD_UDS="+zds)
	cmd.Env = append(cmd.Env, env...)
	inNetnsOf(nb.nodeNS, nb.e.exe)(cmd)
	if err := c.start(); err != nil {
		return nil, err
	}
	nb.e.all = append(nb.e.all, c)
	return c, nil
}

// kill ends a gozt process at once and waits for it.
func kill(c *child) {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// acceptZDS waits for the next ZDS connection to srv from c.
func acceptZDS(ctx context.Context, srv *inpodtest.Server, c *child) (*inpodtest.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := srv.Accept(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: zds accept: %w%s", c.name, err, c.stderr.context())
	}
	return conn, nil
}

// addPods sends an Add for each pod, waiting for each Ack as istio-cni
// does, gap apart, and returns the time each took.
func (nb *nodeBench) addPods(conn *inpodtest.Conn, gap time.Duration) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(nb.pods))
	for _, p := range nb.pods {
		if gap > 0 && len(out) > 0 {
			time.Sleep(gap)
		}
		t := time.Now()
		ack, err := conn.Add(nodePodUID(p.i), p.info(), int(p.ns.Fd()))
		if err == nil && ack != "" {
			err = errors.New(ack)
		}
		if err != nil {
			return nil, fmt.Errorf("add %s: %w", nodePodUID(p.i), err)
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// delPods sends a Del for every pod.
func (nb *nodeBench) delPods(conn *inpodtest.Conn) error {
	for _, p := range nb.pods {
		if ack, err := conn.Del(nodePodUID(p.i)); err != nil || ack != "" {
			return fmt.Errorf("del %s: %q, %v", nodePodUID(p.i), ack, err)
		}
	}
	return nil
}

func snapshotSent(conn *inpodtest.Conn) error {
	if ack, err := conn.SnapshotSent(); err != nil || ack != "" {
		return fmt.Errorf("snapshot sent: %q, %v", ack, err)
	}
	return nil
}

// get fetches path from gozt's port in the node's namespace.
func (nb *nodeBench) get(ctx context.Context, port int, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := nb.web.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return b, err
}

// gozt's side ports in the node's namespace (SPEC §8).
const (
	adminPort   = 15000
	metricsPort = 15020
	readyPort   = 15021
)

// waitReady waits until gozt's readiness port answers 200.
func (nb *nodeBench) waitReady(ctx context.Context, c *child) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := nb.get(ctx, readyPort, "/healthz/ready"); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("%s not ready: %w%s", c.name, err, c.stderr.context())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricValue returns the value of the unlabelled series name in a
// Prometheus text exposition.
func metricValue(text []byte, name string) (float64, error) {
	for line := range strings.SplitSeq(string(text), "\n") {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(rest, &v); err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		return v, nil
	}
	return 0, fmt.Errorf("no series %s", name)
}

// podDial reaches pod pick()'s test server through that pod's SOCKS5
// port, from a socket made in the pod's namespace.
func (nb *nodeBench) podDial(pick func() int) dialFunc {
	socks := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), socksPort)
	return func(ctx context.Context, first []byte) (net.Conn, error) {
		i := pick()
		p := nb.pods[i]
		c, err := sockopt.DialInNetns(ctx, p.netns.Enter, &net.Dialer{}, socks)
		if err != nil {
			return nil, err
		}
		if err := socksHandshake(c, ap(nodePodIP(i), appPort), first); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

func runNode(ctx context.Context, e *env) ([]Result, error) {
	if err := netnsUnavailable(); err != nil {
		msg := "node: skipped, " + err.Error()
		fmt.Fprintln(e.stderr, msg)
		e.notes = append(e.notes, msg)
		return nil, nil
	}
	if e.b.nodeReps > 0 && e.opts.reps == 0 {
		reps := e.b.reps
		e.b.reps = e.b.nodeReps
		defer func() { e.b.reps = reps }()
	}
	nb, err := e.newNodeBench(ctx, e.b.nodePods)
	if err != nil {
		return nil, err
	}
	defer nb.close()
	if err := nb.profileAdds(ctx); err != nil {
		return nil, err
	}
	var rs []Result
	for _, part := range []func(context.Context) ([]Result, error){nb.addLatency, nb.restart, nb.cost, nb.traffic} {
		r, err := part(ctx)
		if err != nil {
			return rs, err
		}
		rs = append(rs, r...)
	}
	return rs, nil
}
