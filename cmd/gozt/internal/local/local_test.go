package local

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/internal/syncbuf"
	"github.com/gozt/gozt/internal/workers"
	"github.com/gozt/gozt/state"
	"go.uber.org/goleak"
	xproxy "golang.org/x/net/proxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop))
}

// meshIPs are the loopback addresses of one test's mesh; every test gets its
// own /24 so tests never share a port.
type meshIPs struct {
	Client, Server, Server2, Plain string
}

var nextNet atomic.Int32

func newIPs() meshIPs {
	return meshIPsIn(77, int(100+nextNet.Add(1)))
}

// meshIPsIn returns the addresses of a mesh in 127.second.third.0/24: the
// client at .2, the servers at .3 and .4, the plain host at .9.
func meshIPsIn(second, third int) meshIPs {
	ip := func(host int) string { return fmt.Sprintf("127.%d.%d.%d", second, third, host) }
	return meshIPs{Client: ip(2), Server: ip(3), Server2: ip(4), Plain: ip(9)}
}

// subnet takes the next /24 of 127.second.0.0/16 above first from next and
// returns the address of a host in it.
func subnet(second, first int32, next *atomic.Int32) func(host int) string {
	n := first + next.Add(1)
	return func(host int) string { return fmt.Sprintf("127.%d.%d.%d", second, n, host) }
}

// clientWorkload is the client workload of the test meshes, at .Client.
const clientWorkload = `
- uid: Kubernetes//Pod/demo/client
  name: client
  namespace: demo
  serviceAccount: client
  workloadIps: [{{.Client}}]
  protocol: HBONE
`

// serverWorkload is the server workload of the test meshes, at .Server.
const serverWorkload = `
- uid: Kubernetes//Pod/demo/server
  name: server
  namespace: demo
  serviceAccount: server
  workloadIps: [{{.Server}}]
  protocol: HBONE
`

// baseConfig is a mesh like the demo: client and server speaking HBONE, a
// service VIP in front of the server(s).
const baseConfig = `
workloads:` + clientWorkload + `  canonicalName: client` + serverWorkload + `  canonicalName: echo
  capacity: 1
  services:
    demo/echo.demo.svc.cluster.local:
      80: 8080
- uid: Kubernetes//Pod/demo/server2
  name: server2
  namespace: demo
  serviceAccount: server
  workloadIps: [{{.Server2}}]
  protocol: HBONE
  canonicalName: echo
  capacity: 3
  services:
    demo/echo.demo.svc.cluster.local:
      80: 8080
services:
- name: echo
  namespace: demo
  hostname: echo.demo.svc.cluster.local
  vips: [/{{.VIP}}]
  ports:
    80: 8080
`

type testMesh struct {
	*Mesh
	ips  meshIPs
	vip  string
	logs *syncbuf.Buffer // every log line of the mesh
}

// Store exposes the mesh state (tests push changes through it).
func (m *Mesh) Store() *state.Store { return m.store }

// CA is the built-in CA.
func (m *Mesh) CA() *localca.CA { return m.ca }

// Certs is the certificate manager.
func (m *Mesh) Certs() *certs.Manager { return m.certs }

// waitLog waits up to 5s for a log line containing s.
func waitLog(t *testing.T, tm *testMesh, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(tm.logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line contains %q; logs:\n%s", s, tm.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startMesh(t *testing.T) *testMesh {
	t.Helper()
	return startMeshWith(t, "")
}

// startMeshWith starts the base mesh with extra YAML appended to its config.
func startMeshWith(t testing.TB, extra string) *testMesh {
	t.Helper()
	return startMeshOpts(t, extra, Options{})
}

// startMeshOpts is startMeshWith with opts as for startConfig.
func startMeshOpts(t testing.TB, extra string, opts Options) *testMesh {
	t.Helper()
	ips := newIPs()
	vip := strings.Replace(ips.Client, "127.77.", "127.78.", 1)
	return startMeshOn(t, ips, vip, extra, opts)
}

// startMeshOn starts the base mesh, with extra YAML appended to its config,
// on ips with vip as the service's VIP; opts are as for startConfig.
func startMeshOn(t testing.TB, ips meshIPs, vip, extra string, opts Options) *testMesh {
	t.Helper()
	data := struct {
		meshIPs
		VIP string
	}{ips, vip}
	m, logs := startConfig(t, baseConfig+extra, data, opts)
	return &testMesh{Mesh: m, ips: ips, vip: vip, logs: logs}
}

// startConfig renders the config template tmpl with data into a file and
// starts a mesh on it with opts (side ports on 127.0.0.1 unless opts names
// them, logs into the returned buffer unless opts has a Logger), shut down at the test's end.
func startConfig(t testing.TB, tmpl string, data any, opts Options) (*Mesh, *syncbuf.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	if err := template.Must(template.New("cfg").Parse(tmpl)).Execute(&buf, data); err != nil {
		t.Fatal(err)
	}
	opts.ConfigPath = writeConfig(t, buf.String())
	opts.AdminAddr = orDefault(opts.AdminAddr, "127.0.0.1:0")
	opts.MetricsAddr = orDefault(opts.MetricsAddr, "127.0.0.1:0")
	opts.ReadinessAddr = orDefault(opts.ReadinessAddr, "127.0.0.1:0")
	logs := &syncbuf.Buffer{}
	if opts.Logger == nil {
		opts.Logger = testLogger(t, logs)
	}
	m, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Shutdown(ctx)
	})
	return m, logs
}

// writeConfig writes cfg to mesh.yaml in a new temporary directory and
// returns its path.
func writeConfig(t testing.TB, cfg string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testLogger records logs at info level into logs, and through t when
// GOZT_TEST_DEBUG is set.
func testLogger(t testing.TB, logs *syncbuf.Buffer) *slog.Logger {
	var w io.Writer = logs
	level := slog.LevelInfo
	if os.Getenv("GOZT_TEST_DEBUG") != "" {
		w = io.MultiWriter(logs, tWriter{t})
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// socksDial connects through the client workload's SOCKS5 port to target,
// with x/net's SOCKS5 client (an implementation we did not write).
func (tm *testMesh) socksDial(t testing.TB, target string) net.Conn {
	t.Helper()
	d, err := xproxy.SOCKS5("tcp", net.JoinHostPort(tm.ips.Client, "15080"), nil, xproxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Dial("tcp", target)
	if err != nil {
		t.Fatalf("socks5 dial %s: %v", target, err)
	}
	return c
}

// wantSocksDenied connects through SOCKS5 to target, an echo server, and
// fails unless the connection ends before its "ping" comes back: a policy
// denied it.
func (tm *testMesh) wantSocksDenied(t testing.TB, target string) {
	t.Helper()
	c := tm.socksDial(t, target)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("ping"))
	if n, err := io.ReadFull(c, make([]byte, 4)); err == nil {
		t.Fatalf("a denied connection to %s was carried: it echoed %d bytes", target, n)
	}
}

// backend is a TCP server that records the source address of each accepted
// connection and runs handle on it.
type backend struct {
	ln      net.Listener
	mu      sync.Mutex
	sources []string
	wg      sync.WaitGroup
}

func listenBackend(t *testing.T, addr string, handle func(net.Conn)) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.sources = append(b.sources, c.RemoteAddr().String())
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.wg.Wait()
	})
	return b
}

func (b *backend) accepted() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.sources...)
}

func echoHandler(c net.Conn) {
	io.Copy(c, c)
	c.(*net.TCPConn).CloseWrite()
}

// prng returns a reader of n seeded pseudo-random bytes.
func prng(seed uint64, n int64) io.Reader {
	return io.LimitReader(&prngReader{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, n)
}

type prngReader struct{ r *rand.Rand }

func (p *prngReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.r.Uint32())
	}
	return len(b), nil
}

// verifyStream reads r to EOF and checks it is exactly n bytes of seed's stream.
func verifyStream(r io.Reader, seed uint64, n int64) error {
	want := prng(seed, n)
	got := bufio.NewReaderSize(r, 64<<10)
	wb := make([]byte, 64<<10)
	gb := make([]byte, 64<<10)
	var off int64
	for {
		k, werr := io.ReadFull(want, wb)
		if k > 0 {
			if _, err := io.ReadFull(got, gb[:k]); err != nil {
				return fmt.Errorf("stream ended early at %d of %d: %v", off, n, err)
			}
			if !bytes.Equal(wb[:k], gb[:k]) {
				return fmt.Errorf("corrupt bytes in [%d, %d)", off, off+int64(k))
			}
			off += int64(k)
		}
		if werr != nil {
			break
		}
	}
	if extra, _ := got.Read(gb[:1]); extra != 0 {
		return fmt.Errorf("extra bytes after %d", n)
	}
	return nil
}

// TestPayloadBothWays sends 64 MiB of seeded random bytes each way through
// SOCKS5 → HBONE → backend and compares them byte for byte, with the backend
// verifying what it receives while it streams its own bytes back.
func TestPayloadBothWays(t *testing.T) {
	tm := startMesh(t)
	const n = 64 << 20
	errs := make(chan error, 1)
	listenBackend(t, tm.ips.Server+":8080", func(c net.Conn) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(c, prng(2, n))
			c.(*net.TCPConn).CloseWrite()
		}()
		errs <- verifyStream(c, 1, n)
		wg.Wait()
	})
	c := tm.socksDial(t, tm.ips.Server+":8080")
	defer c.Close()
	go func() {
		io.Copy(c, prng(1, n))
		c.(*net.TCPConn).CloseWrite()
	}()
	if err := verifyStream(c, 2, n); err != nil {
		t.Errorf("client side: %v", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("backend side: %v", err)
	}
}

// TestHalfCloseClientFirst: the client closes its write side after N bytes;
// the backend reads EOF exactly at N and its reply, sent after, arrives whole.
func TestHalfCloseClientFirst(t *testing.T) {
	tm := startMesh(t)
	const n, reply = 100_000, 3 << 20
	got := make(chan int64, 1)
	listenBackend(t, tm.ips.Server+":8080", func(c net.Conn) {
		k, _ := io.Copy(io.Discard, c) // returns at EOF
		got <- k
		io.Copy(c, prng(7, reply))
		c.(*net.TCPConn).CloseWrite()
	})
	c := tm.socksDial(t, tm.ips.Server+":8080")
	defer c.Close()
	if _, err := io.Copy(c, prng(6, n)); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	if err := verifyStream(c, 7, reply); err != nil {
		t.Errorf("reply after client half-close: %v", err)
	}
	if k := <-got; k != n {
		t.Errorf("backend read %d bytes before EOF, want %d", k, n)
	}
}

// TestHalfCloseServerFirst: the backend closes its write side first; the
// client reads EOF, keeps sending, and everything arrives.
func TestHalfCloseServerFirst(t *testing.T) {
	tm := startMesh(t)
	const greeting, upload = 5000, 4 << 20
	errs := make(chan error, 1)
	listenBackend(t, tm.ips.Server+":8080", func(c net.Conn) {
		io.Copy(c, prng(8, greeting))
		c.(*net.TCPConn).CloseWrite()
		errs <- verifyStream(c, 9, upload)
	})
	c := tm.socksDial(t, tm.ips.Server+":8080")
	defer c.Close()
	if err := verifyStream(c, 8, greeting); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	if _, err := io.Copy(c, prng(9, upload)); err != nil {
		t.Fatalf("upload after server half-close: %v", err)
	}
	c.(*net.TCPConn).CloseWrite()
	if err := <-errs; err != nil {
		t.Errorf("backend: %v", err)
	}
}

// TestSourceIPPreserved: the backend sees the client workload's IP.
func TestSourceIPPreserved(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	b2 := listenBackend(t, tm.ips.Server2+":8080", echoHandler)
	for _, target := range []string{tm.ips.Server + ":8080", tm.vip + ":80", tm.ips.Server2 + ":8080"} {
		c := tm.socksDial(t, target)
		roundTrip(t, c)
		c.Close()
	}
	seen := append(b.accepted(), b2.accepted()...)
	if len(seen) != 3 {
		t.Fatalf("backends accepted %d connections, want 3", len(seen))
	}
	for _, src := range seen {
		if host, _, _ := net.SplitHostPort(src); host != tm.ips.Client {
			t.Errorf("backend saw source %s, want %s", src, tm.ips.Client)
		}
	}
}

func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

// TestVIPCapacityWeights: the service's two endpoints have capacity 1 and 3,
// so about a quarter of the connections reach the first.
func TestVIPCapacityWeights(t *testing.T) {
	tm := startMesh(t)
	b1 := listenBackend(t, tm.ips.Server+":8080", echoHandler)
	b3 := listenBackend(t, tm.ips.Server2+":8080", echoHandler)
	const n = 200
	for range n {
		c := tm.socksDial(t, tm.vip+":80")
		roundTrip(t, c)
		c.Close()
	}
	n1, n3 := len(b1.accepted()), len(b3.accepted())
	if n1+n3 != n {
		t.Fatalf("backends saw %d+%d connections, want %d", n1, n3, n)
	}
	// Binomial(200, 0.25): mean 50, sd 6.1; [26, 74] is ±4 sd.
	if n1 < 26 || n1 > 74 {
		t.Errorf("capacity-1 endpoint got %d of %d connections, want about 50", n1, n)
	}
}

// TestPassthrough: a destination outside the mesh is reached in plain TCP.
func TestPassthrough(t *testing.T) {
	tm := startMesh(t)
	b := listenBackend(t, tm.ips.Plain+":7070", echoHandler)
	c := tm.socksDial(t, tm.ips.Plain+":7070")
	roundTrip(t, c)
	c.Close()
	if got := b.accepted(); len(got) != 1 {
		t.Fatalf("non-mesh listener accepted %d connections, want 1", len(got))
	}
}

// hboneConns counts established TCP connections whose local end is
// ip:15008, from /proc/net/tcp.
func hboneConns(t *testing.T, ip string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr(ip).As4()
	want := fmt.Sprintf("%02X%02X%02X%02X:3AA0", a[3], a[2], a[1], a[0])
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[1] == want && f[3] == "01" {
			n++
		}
	}
	return n
}

// TestPoolSharing: 100 concurrent connections for one pool key share one
// HBONE connection; 250 need at least two.
func TestPoolSharing(t *testing.T) {
	for _, tc := range []struct {
		conns    int
		min, max int
	}{{100, 1, 1}, {250, 2, 3}} {
		t.Run(fmt.Sprint(tc.conns), func(t *testing.T) {
			tm := startMesh(t)
			release := make(chan struct{})
			var held sync.WaitGroup
			held.Add(tc.conns)
			listenBackend(t, tm.ips.Server+":8080", func(c net.Conn) {
				held.Done()
				<-release
			})
			var conns []net.Conn
			for range tc.conns {
				conns = append(conns, tm.socksDial(t, tm.ips.Server+":8080"))
			}
			held.Wait()
			got := hboneConns(t, tm.ips.Server)
			close(release)
			for _, c := range conns {
				c.Close()
			}
			if got < tc.min || got > tc.max {
				t.Errorf("%d concurrent connections used %d HBONE connections, want %d..%d", tc.conns, got, tc.min, tc.max)
			}
		})
	}
}

// TestAdminAndMetrics: /config_dump shows the workloads, services and
// certificates, /metrics the traffic counters, readiness is ready.
func TestAdminAndMetrics(t *testing.T) {
	tm := startMesh(t)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	c := tm.socksDial(t, tm.ips.Server+":8080")
	roundTrip(t, c)
	c.Close()

	var dump struct {
		Workloads []struct {
			UID      string `json:"uid"`
			Protocol string `json:"protocol"`
		} `json:"workloads"`
		Services []struct {
			Hostname string `json:"hostname"`
		} `json:"services"`
		Policies     []json.RawMessage `json:"policies"`
		Certificates []struct {
			Identity string `json:"identity"`
			State    string `json:"state"`
		} `json:"certificates"`
	}
	body := httpGet(t, "http://"+tm.AdminAddr().String()+"/config_dump")
	if err := json.Unmarshal([]byte(body), &dump); err != nil {
		t.Fatalf("config_dump is not JSON: %v", err)
	}
	if len(dump.Workloads) != 3 || dump.Workloads[0].Protocol != "HBONE" {
		t.Errorf("config_dump workloads = %+v", dump.Workloads)
	}
	if len(dump.Services) != 1 || dump.Services[0].Hostname != "echo.demo.svc.cluster.local" {
		t.Errorf("config_dump services = %+v", dump.Services)
	}
	if dump.Policies == nil {
		t.Errorf("config_dump has no policies list")
	}
	foundCert := false
	for _, cj := range dump.Certificates {
		foundCert = foundCert || (cj.Identity == "spiffe://cluster.local/ns/demo/sa/client" && cj.State == "Available")
	}
	if !foundCert {
		t.Errorf("config_dump certificates = %+v, want the client's, Available", dump.Certificates)
	}
	if strings.Contains(body, "PRIVATE KEY") {
		t.Errorf("config_dump contains a private key")
	}

	// Metrics are recorded when each side's connection completes.
	want := [][]string{
		{"istio_tcp_connections_opened_total", `reporter="source"`, `source_workload="client"`,
			`destination_workload="server"`, `connection_security_policy="mutual_tls"`,
			`source_principal="spiffe://cluster.local/ns/demo/sa/client"`, `response_flags="-"`},
		{"istio_tcp_connections_closed_total", `reporter="destination"`, `destination_principal="spiffe://cluster.local/ns/demo/sa/server"`,
			`destination_service="echo.demo.svc.cluster.local"`},
		{"istio_tcp_connections_closed_total", `reporter="source"`},
		{"istio_tcp_received_bytes_total", `reporter="source"`},
		{"istio_tcp_sent_bytes_total", `reporter="destination"`},
	}
	deadline := time.Now().Add(5 * time.Second)
	var metrics string
	for {
		metrics = httpGet(t, "http://"+tm.MetricsAddr().String()+"/metrics")
		missing := ""
		for _, w := range want {
			if metricValue(metrics, w[0], w[1:]...) <= 0 {
				missing = strings.Join(w, " ")
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack a positive %s:\n%s", missing, metrics)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Both access-log lines name both mTLS identities (SPEC §7.3).
	waitLog(t, tm, "src.identity=spiffe://cluster.local/ns/demo/sa/client dst.addr="+tm.ips.Server+":15008")
	for _, dir := range []string{"inbound", "outbound"} {
		waitLog(t, tm, "dst.identity=spiffe://cluster.local/ns/demo/sa/server direction="+dir)
	}
	// 4 bytes each way through the tunnel.
	if got := metricValue(metrics, "istio_tcp_received_bytes_total", `reporter="destination"`); got != 4 {
		t.Errorf("inbound received bytes = %v, want 4", got)
	}
	if got := httpGet(t, "http://"+tm.ReadinessAddr().String()+"/healthz/ready"); !strings.Contains(got, "ready") {
		t.Errorf("readiness = %q", got)
	}
}

// metricValue sums the samples of metric whose labels include every one of
// labels (Prometheus text format; label order does not matter).
func metricValue(metrics, name string, labels ...string) float64 {
	var sum float64
	found := false
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		return -1
	}
	return sum
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	_, b := httpGetHeader(t, url, nil)
	return string(b)
}

// httpGetHeader GETs url with the request header h (or none) on a client
// that keeps no connection open, and returns the response and its body.
func httpGetHeader(t testing.TB, url string, h http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(req.Header, h)
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestQuitQuitQuit: POST only; POST signals shutdown.
func TestQuitQuitQuit(t *testing.T) {
	tm := startMesh(t)
	url := "http://" + tm.AdminAddr().String() + "/quitquitquit"
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /quitquitquit = %d, want 405", resp.StatusCode)
	}
	select {
	case <-tm.Quit():
		t.Fatal("GET triggered shutdown")
	default:
	}
	resp, err = cl.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case <-tm.Quit():
	case <-time.After(2 * time.Second):
		t.Fatal("POST /quitquitquit did not signal shutdown")
	}
}

var _ = tls.VersionTLS13
