package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// liveNet numbers the 127.82.N.0/24 of each live-view test mesh.
var liveNet atomic.Int32

// liveDenyConfig denies the client's identity on port 8080 of namespace
// demo, in the second rule of the policy (so the page must show rule 1).
var liveDenyConfig = denyClient8080Config("  - - - destinationPorts: [7]\n")

// startLiveMesh starts the base mesh with the DENY policy on loopback
// addresses of its own in 127.82.0.0/16.
func startLiveMesh(t *testing.T) *testMesh {
	t.Helper()
	n := 10 + liveNet.Add(1)
	ips := meshIPsIn(82, int(n))
	vip := fmt.Sprintf("127.82.%d.100", n)
	return startMeshOn(t, ips, vip, liveDenyConfig, Options{
		AdminAddr:     "127.82.0.1:0",
		MetricsAddr:   "127.82.0.1:0",
		ReadinessAddr: "127.82.0.1:0",
	})
}

// chromiumPath finds the headless browser `make test-deps` installs. Without
// one the test skips, or fails under GOZT_REQUIRE_ROOT=1 (CI), so a missing
// browser never passes for green.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("GOZT_REQUIRE_ROOT") == "1" {
		t.Fatal("FAILING the live-view browser test: no chromium on PATH and GOZT_REQUIRE_ROOT=1 (make test-deps installs it)")
	}
	t.Skip("SKIPPING the live-view browser test: no chromium on PATH (make test-deps installs it)")
	return ""
}

// newBrowser starts a headless chromium with a fresh profile and returns a
// tab's context; the browser is killed and waited for at cleanup.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 1000),
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:], opts...)...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // kills the browser and waits for it
	})
	return ctx
}

// liveDOM is what the rendered page shows, read from its DOM.
type liveDOM struct {
	Updates   int `json:"updates"`
	Workloads []struct {
		UID, Name, Identity, Cert, Expiry, ExpiryText string
	} `json:"workloads"`
	Conns []struct {
		Dir, Src, Dst, Req, Resp string
	} `json:"conns"`
	Denials []struct {
		Src, Workload, Dst, Policy, Rule, Reason string
	} `json:"denials"`
	ControlPlane map[string]string `json:"controlPlane"`
}

// readDOMJS collects liveDOM from the page's elements (their rendered
// text), not from the JSON the page fetched.
const readDOMJS = `(() => {
  const txt = (r, sel) => { const e = r.querySelector(sel); return e ? e.textContent.trim() : ""; };
  const cp = {};
  document.querySelectorAll("#cp .link").forEach(l => { cp[l.id.replace("cp-", "")] = txt(l, ".state"); });
  return {
    updates: Number(document.body.dataset.updates),
    workloads: [...document.querySelectorAll("#workloads tbody tr[data-uid]")].map(r => ({
      UID: r.dataset.uid, Name: txt(r, ".wl-name div"), Identity: txt(r, ".identity"), Cert: txt(r, ".cert-state"),
      Expiry: r.querySelector(".cert-expiry").dataset.expiry, ExpiryText: txt(r, ".cert-expiry")})),
    conns: [...document.querySelectorAll("#conns tbody tr[data-key]")].map(r => ({
      Dir: r.dataset.direction, Src: txt(r, ".src"), Dst: txt(r, ".dst"), Req: txt(r, ".req"), Resp: txt(r, ".resp")})),
    denials: [...document.querySelectorAll("#denials tbody tr.deny")].map(r => ({
      Src: txt(r, ".src"), Workload: txt(r, ".workload"), Dst: txt(r, ".dst"), Policy: txt(r, ".policy"),
      Rule: txt(r, ".rule"), Reason: txt(r, ".reason")})),
    controlPlane: cp,
  };
})()`

// waitDOM reads the page until cond holds, failing with the last reading
// if it does not within the test's bound.
func waitDOM(t *testing.T, ctx context.Context, what string, cond func(*liveDOM) bool) *liveDOM {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a bound for a loaded machine, not a timing assertion
	for {
		d, err := chromedp.Run(ctx, chromedp.Evaluate[*liveDOM](readDOMJS))
		if err != nil {
			t.Fatalf("reading the live page: %v", err)
		}
		if d != nil && cond(d) {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live page never showed %s; last DOM: %+v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shownBytes parses a byte cell ("12,345 B").
func shownBytes(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.NewReplacer(",", "", " B", "").Replace(s), 10, 64)
	if err != nil {
		t.Fatalf("byte cell %q: %v", s, err)
	}
	return n
}

// echoBytes sends n random bytes on c and reads the echo back.
func echoBytes(t *testing.T, c net.Conn, n int) {
	t.Helper()
	out := make([]byte, n)
	rand.Read(out)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	in := make([]byte, n)
	if _, err := io.ReadFull(c, in); err != nil {
		t.Fatalf("echo of %d bytes: %v", n, err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("echo differs from what was sent")
	}
}

// TestLiveViewInBrowser loads the admin live view in headless chromium
// against a running mesh and checks, from the rendered DOM, that it shows
// the demo workloads with their identities and certificate expiry, a
// long-lived connection whose byte counts grow as more bytes flow, a denial
// with its policy and rule, and the control plane. It takes a screenshot;
// GOZT_UPDATE_SCREENSHOT=1 writes it to docs/live-view.png.
func TestLiveViewInBrowser(t *testing.T) {
	ctx := newBrowser(t)
	tm := startLiveMesh(t)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	listenBackend(t, tm.ips.Server+":9090", echoHandler)

	tm.wantSocksDenied(t, tm.ips.Server+":8080")

	long := tm.socksDial(t, tm.ips.Server+":9090")
	defer long.Close()
	echoBytes(t, long, 1000)

	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+tm.AdminAddr().String()+"/")); err != nil {
		t.Fatalf("loading the live view: %v", err)
	}
	first := waitDOM(t, ctx, "the workloads, the connection and the denial", func(d *liveDOM) bool {
		return len(d.Workloads) == 3 && len(d.Denials) > 0 && outboundConn(d, tm.ips.Server+":9090") >= 0
	})

	// The demo workloads, each with its identity; those that served
	// traffic with the certificate the manager holds and its expiry.
	certs := map[string]time.Time{}
	for _, st := range tm.Certs().States() {
		if st.Cert != nil {
			certs[st.Identity.String()] = st.Cert.Chain()[0].NotAfter.UTC()
		}
	}
	for _, want := range []struct{ name, id string }{
		{"demo/client", "spiffe://cluster.local/ns/demo/sa/client"},
		{"demo/server", "spiffe://cluster.local/ns/demo/sa/server"},
		{"demo/server2", "spiffe://cluster.local/ns/demo/sa/server"},
	} {
		found := false
		for _, w := range first.Workloads {
			if w.Name != want.name {
				continue
			}
			found = true
			if w.Identity != want.id {
				t.Errorf("workload %s shows identity %q, want %q", want.name, w.Identity, want.id)
			}
			if want.name == "demo/server2" {
				continue // never served, so maybe no certificate yet
			}
			exp, err := time.Parse(time.RFC3339, w.Expiry)
			if err != nil || !exp.Equal(certs[want.id].Truncate(time.Second)) || w.Cert != "Available" {
				t.Errorf("workload %s shows certificate %q expiring %q, want Available expiring %v", want.name, w.Cert, w.Expiry, certs[want.id])
			}
			in := fmt.Sprintf("in %dh", int(time.Until(exp).Hours()))
			if !strings.Contains(w.ExpiryText, exp.Format("2006-01-02 15:04:05Z")) || !strings.Contains(w.ExpiryText, in) {
				t.Errorf("workload %s expiry cell %q does not show %v, %s…", want.name, w.ExpiryText, exp, in)
			}
		}
		if !found {
			t.Errorf("the live view does not list workload %s: %+v", want.name, first.Workloads)
		}
	}

	// The long-lived connection, with both sides' workloads and identities
	// (its source address is the SOCKS5 client's).
	c := first.Conns[outboundConn(first, tm.ips.Server+":9090")]
	for _, want := range []string{"demo/client", "spiffe://cluster.local/ns/demo/sa/client", long.LocalAddr().String()} {
		if !strings.Contains(c.Src, want) {
			t.Errorf("connection source %q does not show %q", c.Src, want)
		}
	}
	for _, want := range []string{"demo/server", "spiffe://cluster.local/ns/demo/sa/server", tm.ips.Server + ":9090"} {
		if !strings.Contains(c.Dst, want) {
			t.Errorf("connection destination %q does not show %q", c.Dst, want)
		}
	}
	req1, resp1 := shownBytes(t, c.Req), shownBytes(t, c.Resp)
	if req1 < 1000 || resp1 < 1000 {
		t.Errorf("connection shows %d / %d bytes after a 1000-byte echo", req1, resp1)
	}

	// More bytes flow: the counts the page shows grow by at least as much.
	const more = 64 << 10
	echoBytes(t, long, more)
	grown := waitDOM(t, ctx, "the connection's bytes growing", func(d *liveDOM) bool {
		i := outboundConn(d, tm.ips.Server+":9090")
		return i >= 0 && shownBytes(t, d.Conns[i].Req) >= req1+more && shownBytes(t, d.Conns[i].Resp) >= resp1+more
	})
	if inbound := inboundConns(grown, tm.ips.Server+":9090"); inbound == 0 {
		t.Errorf("the server's inbound side of the connection is not listed: %+v", grown.Conns)
	}

	// The denial, with the policy and the rule that decided.
	d := first.Denials[0]
	if d.Policy != "demo/deny-client-8080" || d.Rule != "1" || d.Workload != "demo/server" ||
		!strings.Contains(d.Src, "spiffe://cluster.local/ns/demo/sa/client") || !strings.Contains(d.Dst, tm.ips.Server+":8080") {
		t.Errorf("denial shown as %+v, want policy demo/deny-client-8080 rule 1 for client → server:8080", d)
	}
	if got := first.ControlPlane; got["xds"] != "static" || got["ca"] != "built-in" || got["zds"] != "" {
		t.Errorf("control plane shown as %v, want xds static and ca built-in, no zds", got)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
	if os.Getenv("GOZT_UPDATE_SCREENSHOT") == "1" {
		path := filepath.Join("..", "..", "..", "..", "docs", "live-view.png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", path)
	}
}

// outboundConn is the index of the outbound connection to dst the page
// shows, or -1.
func outboundConn(d *liveDOM, dst string) int {
	for i, c := range d.Conns {
		if c.Dir == "outbound" && strings.Contains(c.Dst, dst+" ") {
			return i
		}
	}
	return -1
}

// inboundConns counts the inbound connections the page shows that were
// for dst.
func inboundConns(d *liveDOM, dst string) int {
	n := 0
	for _, c := range d.Conns {
		if c.Dir == "inbound" && strings.Contains(c.Dst, dst) {
			n++
		}
	}
	return n
}
