package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"istio.io/istio/pkg/workloadapi"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/proxy/inpod/inpodtest"
	"github.com/gozt/gozt/xds/xdstest"
)

// What the test gives the pod in place of the kubelet.
const (
	podName    = "ztunnel-x7k2p"
	nodeName   = "node-1"
	podIP      = "10.244.0.5" // INSTANCE_IP, on the node netns's loopback
	appIP      = "10.244.0.9" // the ambient pod handed over by ZDS
	istioToken = "the-projected-istio-ca-token"
	// capMask is CAP_NET_ADMIN (12), CAP_NET_RAW (13) and CAP_SYS_ADMIN (21),
	// as /proc/PID/status prints a capability set.
	capMask = "0000000000203000"
)

// TestChartStartsGozt runs the gozt binary as the kubelet would run the
// container of Istio's chart (with our values and the ambient profile) and
// of our own DaemonSet: exactly the container's environment (valueFrom
// fields filled in) and arguments, the image's entrypoint and working
// directory, the chart's volumes mounted where it mounts them, a read-only
// root, uid 0 / gid 1337 and only the chart's capabilities. gozt must
// become ready on the pod IP's 15021, serve a pod that the test's istio-cni
// hands it over ZDS, and exit 0 on SIGTERM within the grace period.
//
// Each run gets a network namespace of its own, with the fake istiod (xDS
// and CA) listening on its loopback: gozt binds 15000, 15020 and 15021 as in
// a pod, which would clash with tests of other packages in the test's own
// namespace, and a veth pair would only add routes to get wrong. The
// container's mount namespace is made by unshare(1) and the capabilities
// are set by setpriv(1), both from util-linux.
func TestChartStartsGozt(t *testing.T) {
	nstest.RequireRoot(t, "ip", "unshare", "setpriv", "mount", "sh")
	bin := goztBinary(t)
	for _, tc := range []struct {
		name string
		ds   func() *appsv1.DaemonSet
	}{
		{"chart", func() *appsv1.DaemonSet {
			return render(t, withValues(ourValues(t), map[string]any{"profile": "ambient"}))
		}},
		{"manifest", func() *appsv1.DaemonSet { _, ds := manifest(t); return ds }},
	} {
		t.Run(tc.name, func(t *testing.T) { runDaemonSet(t, bin, tc.ds()) })
	}
}

// istiod is the fake control plane inside a node's network namespace.
type istiod struct {
	ca  *localca.CA
	xds *xdstest.Server
	cas *istiocatest.Server
}

// startIstiod starts the fake xDS server and CA with their listeners in the
// network namespace at nsPath.
func startIstiod(t *testing.T, nsPath string) *istiod {
	t.Helper()
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cp := &istiod{ca: ca}
	stls := istiocatest.ServerTLS(t, ca, "127.0.0.1")
	// Both constructors make their listeners before returning, so the
	// sockets are the namespace's; their failures end the test from this
	// goroutine only after the thread is restored.
	err = nstest.InNetns(nsPath, func() error {
		cp.xds = xdstest.NewServer(t, stls)
		cp.cas = istiocatest.NewServer(t, ca, stls)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

// runDaemonSet starts gozt as ds's container and checks it serves.
func runDaemonSet(t *testing.T, bin string, ds *appsv1.DaemonSet) {
	n := startNode(t, bin, ds, 0)
	metrics := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(podIP, strconv.Itoa(int(n.c.Ports[0].ContainerPort))))
	if code, body := get(n.client, metrics); code != http.StatusOK || !strings.Contains(body, "workload_manager_active_proxy_count 1") {
		t.Errorf("GET %s = %d, want 200 with one active pod proxy:\n%.2000s", metrics, code, body)
	}
	checkPodListener(t, n.podPath, "spiffe://cluster.local/ns/demo/sa/app")
	checkPodTraffic(t, n.cp, n.podPath, n.p)
	checkCSRs(t, n.cp, n.p)
	n.p.stop(t, ds)
}

// chartNode is gozt run as the chart's container in a node network
// namespace of its own, ready, serving one ambient pod (app, appIP) that
// the test's istio-cni handed it.
type chartNode struct {
	cp      *istiod
	p       *proc
	c       *corev1.Container
	podPath string
	client  *http.Client // connections from the node's namespace
}

// startNode starts gozt as ds's container would run, with an open-file
// limit (soft and hard) of nofile if positive, hands it the pod over ZDS
// and waits for its readiness probe to answer 200.
func startNode(t *testing.T, bin string, ds *appsv1.DaemonSet, nofile int) *chartNode {
	nodeNS := nstest.NewNetns(t)
	nstest.Run(t, "ip", "-n", nodeNS, "addr", "add", podIP+"/32", "dev", "lo")
	nodePath := "/run/netns/" + nodeNS
	cp := startIstiod(t, nodePath)

	dir := t.TempDir()
	sock := filepath.Join(dir, "hostpath", "ztunnel.sock")
	writeFile(t, filepath.Join(dir, "configmap", "root-cert.pem"), cp.ca.RootPEM())
	writeFile(t, filepath.Join(dir, "projected", "istio-token"), []byte(istioToken))
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	cni := inpodtest.NewServer(t, sock)

	c := container(t, ds)
	env := containerEnv(t, ds, c, map[string]string{
		"CA_ADDRESS":  cp.cas.Addr(), // host:port, as the chart writes istiod's
		"XDS_ADDRESS": cp.xds.Addr(),
	})
	script := mountScript(t, ds, c, bin, dir)
	if nofile > 0 {
		script = strings.Replace(script, "\nexec setpriv ", fmt.Sprintf("\nulimit -n %d\nexec setpriv ", nofile), 1)
	}
	p := startContainer(t, nodeNS, script, c, env)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	zds, err := cni.Accept(ctx)
	if err != nil {
		t.Fatalf("gozt did not connect to istio-cni's socket: %v\n%s", err, p.logs())
	}
	p.checkSecurity(t, c)

	app := workloadapi.Workload{
		Uid: "Kubernetes//Pod/demo/app", Name: "app", Namespace: "demo", ServiceAccount: "app",
		Node: nodeName, Addresses: [][]byte{net.ParseIP(appIP).To4()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}
	cp.xds.PushWorkload(&app)
	podNS := nstest.NewNetns(t)
	nstest.Run(t, "ip", "-n", podNS, "addr", "add", appIP+"/32", "dev", "lo")
	podPath := "/run/netns/" + podNS
	f, err := os.Open(podPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info := inpod.WorkloadInfo{Name: app.Name, Namespace: app.Namespace, ServiceAccount: app.ServiceAccount}
	if ack, err := zds.Add("pod-uid-app", info, int(f.Fd())); err != nil || ack != "" {
		t.Fatalf("ZDS Add = %q, %v\n%s", ack, err, p.logs())
	}
	if ack, err := zds.SnapshotSent(); err != nil || ack != "" {
		t.Fatalf("ZDS SnapshotSent = %q, %v\n%s", ack, err, p.logs())
	}

	client := netnsHTTPClient(nodePath)
	probe := c.ReadinessProbe.HTTPGet
	ready := fmt.Sprintf("http://%s/%s", net.JoinHostPort(podIP, probe.Port.String()), strings.TrimPrefix(probe.Path, "/"))
	waitReady(t, client, ready, p)
	return &chartNode{cp: cp, p: p, c: c, podPath: podPath, client: client}
}

// containerEnv is c's environment as the kubelet would make it, with
// overrides replacing variables the container sets (each must be set),
// plus what the runtime and the kubelet add to every container.
func containerEnv(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container, overrides map[string]string) []string {
	t.Helper()
	fields := map[string]string{
		"metadata.name":           podName,
		"metadata.namespace":      ds.Namespace,
		"spec.nodeName":           nodeName,
		"status.podIP":            podIP,
		"spec.serviceAccountName": ds.Spec.Template.Spec.ServiceAccountName,
	}
	// With divisor 1 the kubelet rounds up; with no limit it gives the
	// node's allocatable CPUs.
	resources := map[string]string{"limits.cpu": "2", "requests.cpu": "1"}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME=" + podName,
		"KUBERNETES_SERVICE_HOST=10.96.0.1",
		"KUBERNETES_SERVICE_PORT=443",
	}
	seen := make(map[string]bool)
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			var ok bool
			if v, ok = fields[e.ValueFrom.FieldRef.FieldPath]; !ok {
				t.Fatalf("%s: no test value for field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Divisor.String() == "1":
			var ok bool
			if v, ok = resources[e.ValueFrom.ResourceFieldRef.Resource]; !ok {
				t.Fatalf("%s: no test value for resource %s", e.Name, e.ValueFrom.ResourceFieldRef.Resource)
			}
		default:
			t.Fatalf("%s: no test value for %+v", e.Name, e.ValueFrom)
		}
		if o, ok := overrides[e.Name]; ok {
			seen[e.Name] = true
			v = o
		}
		env = append(env, e.Name+"="+v)
	}
	for name := range overrides {
		if !seen[name] {
			t.Fatalf("the container does not set %s", name)
		}
	}
	return env
}

// mountScript returns a shell script that, run as root in a fresh mount
// namespace, lays out the container's filesystem over this machine's — the
// image's binary at /usr/local/bin, each of c's volume mounts from a
// directory under dir, the root read-only if the container says so — and
// execs the container's process as its security context says.
func mountScript(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container, bin, dir string) string {
	t.Helper()
	volumes := make(map[string]corev1.Volume)
	for _, v := range ds.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	var s strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&s, format+"\n", args...) }
	line("set -eu")
	// The image: its binaries, as deploy/image lays them out.
	line("mount -t tmpfs -o mode=755 image /usr/local/bin")
	line("touch /usr/local/bin/gozt && mount --bind -o ro %s /usr/local/bin/gozt", quote(bin))
	line("ln -s gozt /usr/local/bin/ztunnel")
	// A /var/run of the container's own (the image has none; the mounts
	// below make the directories), then the volumes: emptyDirs last, as
	// they may hide the test's directories under /tmp.
	line("mount -t tmpfs -o mode=755 image-run /var/run")
	var empty []string
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("volume mount %s has no volume", m.Name)
		}
		var src string
		ro := m.ReadOnly
		switch {
		case v.EmptyDir != nil:
			empty = append(empty, m.MountPath)
			continue
		case v.ConfigMap != nil && v.ConfigMap.Name == "istio-ca-root-cert":
			src, ro = filepath.Join(dir, "configmap"), true // the kubelet mounts configMaps read-only
		case v.Projected != nil && len(v.Projected.Sources) == 1 && v.Projected.Sources[0].ServiceAccountToken != nil:
			if v.Projected.Sources[0].ServiceAccountToken.Audience != "istio-ca" {
				t.Errorf("token volume %s has audience %q, want istio-ca", v.Name, v.Projected.Sources[0].ServiceAccountToken.Audience)
			}
			src, ro = filepath.Join(dir, "projected"), true
		case v.HostPath != nil && v.HostPath.Path == "/var/run/ztunnel":
			src = filepath.Join(dir, "hostpath")
		default:
			t.Fatalf("no stand-in for volume %s: %+v", v.Name, v.VolumeSource)
		}
		line("mkdir -p %s && mount --bind %s %s", quote(m.MountPath), quote(src), quote(m.MountPath))
		if ro {
			line("mount -o remount,bind,ro %s", quote(m.MountPath))
		}
	}
	for _, p := range empty {
		line("mkdir -p %s && mount -t tmpfs -o mode=1777 emptydir %s", quote(p), quote(p))
	}
	if sc := c.SecurityContext; sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		// bind: only this namespace's mounts change, never the filesystem.
		line("mount -o remount,bind,ro /")
		line("mount -o remount,bind,ro /usr/local/bin")
		line("mount -o remount,bind,ro /var/run")
	}
	line("cd %s", quote(orDefault(c.WorkingDir, "/")))
	line(`exec setpriv %s /usr/local/bin/gozt "$@"`, setprivArgs(t, c))
	return s.String()
}

// setprivArgs turns c's security context into setpriv's flags: the user
// and group, no supplementary groups, and the capability bounding set (for
// uid 0 the kernel makes it the permitted and effective sets at exec, as
// container runtimes arrange for root).
func setprivArgs(t *testing.T, c *corev1.Container) string {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil || sc.Capabilities == nil {
		t.Fatalf("container has no user, group or capabilities: %+v", sc)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Fatalf("capabilities drop %v, want ALL", sc.Capabilities.Drop)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Fatal("container is privileged")
	}
	caps := "-all"
	for _, c := range sc.Capabilities.Add {
		caps += ",+" + strings.ToLower(string(c))
	}
	return fmt.Sprintf("--reuid=%d --regid=%d --clear-groups --inh-caps=-all --bounding-set=%s",
		*sc.RunAsUser, *sc.RunAsGroup, caps)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// proc is the running container.
type proc struct {
	cmd    *exec.Cmd
	out    *os.File // stdout and stderr
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// startContainer runs script in the network namespace ns and a mount
// namespace of its own, with c's args and exactly env. ip, unshare, sh and
// setpriv each exec the next, so the process is gozt itself.
func startContainer(t *testing.T, ns, script string, c *corev1.Container, env []string) *proc {
	t.Helper()
	out, err := os.Create(filepath.Join(t.TempDir(), "gozt.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", script, "sh"}, c.Args...)
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: exec.Command(ip, args...), out: out, exited: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		out.Close()
	})
	return p
}

// logs returns what the container printed so far.
func (p *proc) logs() string {
	b, _ := os.ReadFile(p.out.Name())
	return "gozt's output:\n" + string(b)
}

// checkSecurity checks the running gozt's identity, capabilities and root
// mount against c's security context.
func (p *proc) checkSecurity(t *testing.T, c *corev1.Container) {
	t.Helper()
	pid := strconv.Itoa(p.cmd.Process.Pid)
	exe, err := os.Readlink("/proc/" + pid + "/exe")
	if err != nil || filepath.Base(exe) != "gozt" {
		t.Fatalf("process %s runs %q (%v), want gozt\n%s", pid, exe, err, p.logs())
	}
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	sc := c.SecurityContext
	want := map[string]string{
		"Uid":    strings.Repeat(strconv.FormatInt(*sc.RunAsUser, 10)+"\t", 3) + strconv.FormatInt(*sc.RunAsUser, 10),
		"Gid":    strings.Repeat(strconv.FormatInt(*sc.RunAsGroup, 10)+"\t", 3) + strconv.FormatInt(*sc.RunAsGroup, 10),
		"Groups": "",
		"CapInh": "0000000000000000",
		"CapPrm": capMask,
		"CapEff": capMask,
		"CapBnd": capMask,
	}
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if w, ok := want[k]; ok && strings.TrimSpace(v) != w {
			t.Errorf("gozt's %s: %q, want %q", k, strings.TrimSpace(v), w)
		}
	}
	mounts, err := os.ReadFile("/proc/" + pid + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	root := ""
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == "/" {
			root = f[5]
		}
	}
	if !strings.HasPrefix(root, "ro,") {
		t.Errorf("gozt's root is mounted %q, want read-only", root)
	}
}

// stop sends SIGTERM and requires gozt to exit 0 within the pod's grace
// period.
func (p *proc) stop(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	grace := 30 * time.Second
	if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("gozt exited with %v after SIGTERM\n%s", p.err, p.logs())
		}
		t.Logf("gozt exited %v after SIGTERM; %s", time.Since(start).Round(time.Millisecond), p.logs())
	case <-time.After(grace):
		t.Errorf("gozt still running %v after SIGTERM\n%s", grace, p.logs())
	}
	if logs := p.logs(); strings.Contains(logs, "\terror\t") { // ztunnel's plain format: time, level, scope
		t.Errorf("gozt logged errors:\n%s", logs)
	}
}

// netnsHTTPClient is an HTTP client whose connections are made in the
// network namespace at nsPath, as the kubelet's probes reach the pod IP.
func netnsHTTPClient(nsPath string) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nstest.InNetns(nsPath, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
	}
}

func get(c *http.Client, url string) (int, string) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls the readiness probe until it answers 200.
func waitReady(t *testing.T, c *http.Client, url string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get(c, url)
		if code == http.StatusOK {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("gozt exited (%v) before it was ready\n%s", p.err, p.logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q after 20s, want 200\n%s", url, code, body, p.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkPodListener connects to 15008 from inside the pod's namespace and
// requires gozt to answer TLS there with the pod's certificate.
func checkPodListener(t *testing.T, podPath, wantID string) {
	t.Helper()
	var conn net.Conn
	err := nstest.InNetns(podPath, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(appIP, "15008"), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("connect to the pod's 15008 from inside the pod: %v", err)
	}
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatalf("TLS handshake with the pod's 15008: %v", err)
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 || len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != wantID {
		var got []string
		if len(certs) > 0 {
			for _, u := range certs[0].URIs {
				got = append(got, u.String())
			}
		}
		t.Errorf("the pod's 15008 presented %v, want %s", got, wantID)
	}
}

// checkPodTraffic carries bytes through the chart-run gozt: an HBONE CONNECT
// with a mesh client's certificate to the pod's 15008 reaches an echo app
// inside the pod, and 256 KiB of seeded random bytes come back intact.
func checkPodTraffic(t *testing.T, cp *istiod, podPath string, p *proc) {
	t.Helper()
	var lis net.Listener
	err := nstest.InNetns(podPath, func() (err error) {
		lis, err = net.Listen("tcp", net.JoinHostPort(appIP, "8080"))
		return err
	})
	if err != nil {
		t.Fatalf("pod listener: %v", err)
	}
	defer lis.Close()
	go func() {
		if up, err := lis.Accept(); err == nil {
			io.Copy(up, up)
			up.Close()
		}
	}()
	cc := dialPodHBONE(t, cp, podPath, p)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cc.Connect(ctx, net.JoinHostPort(appIP, "8080"), nil)
	if err != nil {
		t.Fatalf("CONNECT through the chart-run gozt: %v\n%s", err, p.logs())
	}
	defer s.Close()
	payload := make([]byte, 256<<10)
	r := rand.New(rand.NewPCG(15, 8))
	for i := range payload {
		payload[i] = byte(r.Uint32())
	}
	go func() {
		s.Write(payload)
		s.CloseWrite()
	}()
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, payload) {
		t.Errorf("echo through the pod: %d of %d bytes back, equal %v, err %v", len(got), len(payload), bytes.Equal(got, payload), err)
	}
}

// dialPodHBONE opens an HBONE connection to the pod's 15008 from inside the
// pod's namespace, with a mesh client's certificate.
func dialPodHBONE(t *testing.T, cp *istiod, podPath string, p *proc) *hbone.ClientConn {
	t.Helper()
	var conn net.Conn
	err := nstest.InNetns(podPath, func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(appIP, "15008"), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("connect to the pod's 15008: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cert, err := cp.ca.Issue(ctx, identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, certs.ClientConfig(cert, []string{"spiffe://cluster.local/ns/demo/sa/app"}))
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		t.Fatalf("mTLS with the pod's 15008: %v\n%s", err, p.logs())
	}
	cc, err := hbone.NewClientConn(ctx, tc, hbone.Config{})
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return cc
}

// checkCSRs requires every CSR that reached the fake CA to carry the
// projected token and the chart's cluster id.
func checkCSRs(t *testing.T, cp *istiod, p *proc) {
	t.Helper()
	reqs := cp.cas.Requests()
	if len(reqs) == 0 {
		t.Fatalf("no CSR reached the CA\n%s", p.logs())
	}
	for _, r := range reqs {
		if r.Authorization != "Bearer "+istioToken || r.ClusterID != "Kubernetes" {
			t.Errorf("CSR for %v: authorization %q, cluster id %q; want the projected token and Kubernetes",
				r.Identity, r.Authorization, r.ClusterID)
		}
	}
}
