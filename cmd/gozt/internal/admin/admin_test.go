package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/gozt/gozt/internal/workers"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(workers.IdleTop)) }

func do(t *testing.T, method, url string, hdr http.Header) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestAdminLoopbackOnly: the admin port refuses any non-loopback address
// (TESTPLAN S28, bad input 59).
func TestAdminLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0"} {
		if _, err := ListenAdmin(context.Background(), addr, Config{}); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("ListenAdmin(%q) = %v, want %v", addr, err, ErrNotLoopback)
		}
	}
}

func TestSidePorts(t *testing.T) {
	quit := make(chan struct{})
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "istio_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	ready := NewReadiness("state manager", "proxy")
	p, err := ListenAll(context.Background(), Addrs{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"}, Config{
		ConfigDump: func() any { return map[string]int{"workloads": 0} },
		Quit:       func() { close(quit) },
		Levels:     logscope.NewLevels(logscope.Filter{}),
	}, reg, ready)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	admin := "http://" + p.Admin.Addr().String()
	ready1 := "http://" + p.Readiness.Addr().String() + "/healthz/ready"

	for _, tc := range []struct {
		method, url string
		hdr         http.Header
		code        int
		body        string
	}{
		{"GET", admin + "/config_dump", nil, 200, `"workloads": 0`},
		{"GET", admin + "/nope", nil, 404, ""},
		{"GET", admin + "/logging", nil, 405, "usage"},
		{"POST", admin + "/logging", nil, 200, "current log level is info"},
		{"POST", admin + "/logging?level=debug", nil, 200, "current log level is debug"},
		{"POST", admin + "/logging?level=loud", nil, 400, "invalid level provided"},
		{"POST", admin + "/logging?reset", nil, 200, "current log level is info"},
		{"GET", admin + "/quitquitquit", nil, 405, ""},
		{"GET", ready1, nil, 500, "not ready, pending: proxy, state manager"},
		{"POST", ready1, nil, 405, ""},
		{"GET", "http://" + p.Metrics.Addr().String() + "/metrics", nil, 200, "istio_test_total 1"},
		{"GET", "http://" + p.Metrics.Addr().String() + "/stats/prometheus",
			http.Header{"Accept": {"application/openmetrics-text; version=1.0.0"}}, 200, "# EOF"},
	} {
		code, body, _ := do(t, tc.method, tc.url, tc.hdr)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s = %d %q, want %d containing %q", tc.method, tc.url, code, body, tc.code, tc.body)
		}
	}
	ready.Unblock("proxy")
	ready.Unblock("state manager")
	if code, body, _ := do(t, "GET", ready1, nil); code != 200 || !strings.HasPrefix(body, "ready") {
		t.Errorf("readiness when unblocked = %d %q", code, body)
	}
	// A condition blocks while it holds, asked at each request.
	var exhausted atomic.Bool
	ready.BlockWhile("file descriptors exhausted", exhausted.Load)
	exhausted.Store(true)
	if code, body, _ := do(t, "GET", ready1, nil); code != 500 || body != "not ready, pending: file descriptors exhausted\n" {
		t.Errorf("readiness while a condition holds = %d %q", code, body)
	}
	exhausted.Store(false)
	if code, body, _ := do(t, "GET", ready1, nil); code != 200 || !strings.HasPrefix(body, "ready") {
		t.Errorf("readiness once the condition cleared = %d %q", code, body)
	}
	if code, body, _ := do(t, "POST", admin+"/quitquitquit", nil); code != 200 || !strings.Contains(body, "shutdown now") {
		t.Errorf("POST /quitquitquit = %d %q", code, body)
	}
	select {
	case <-quit:
	case <-time.After(2 * time.Second):
		t.Fatal("quit not signalled")
	}
}

// TestAdminRefusesForeignHost: a request whose Host is not loopback (what a
// browser sends after a hostile page's DNS rebinding) gets 403 on every
// admin path; loopback names and addresses, with or without a port, pass.
func TestAdminRefusesForeignHost(t *testing.T) {
	s, err := ListenAdmin(context.Background(), "127.0.0.1:0", Config{
		ConfigDump: func() any { return map[string]int{"workloads": 0} },
		Quit:       func() {},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	url := "http://" + s.Addr().String()
	for _, tc := range []struct {
		host string
		code int
	}{
		{"", 200}, // the dialed address
		{"localhost", 200},
		{"LOCALHOST:15000", 200},
		{"127.0.0.1:15000", 200},
		{"127.1.2.3", 200},
		{"[::1]:15000", 200},
		{"evil.example:15000", 403},
		{"evil.example", 403},
		{"10.0.0.1:15000", 403},
		{"localhost.evil.example", 403},
		{"[::ffff:8.8.8.8]:15000", 403},
	} {
		for _, path := range []string{"/config_dump", "/debug/live", "/"} {
			req, err := http.NewRequest("GET", url+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if tc.code == 403 && resp.StatusCode != 403 || tc.code == 200 && resp.StatusCode == 403 {
				t.Errorf("GET %s with Host %q = %d, want %d", path, tc.host, resp.StatusCode, tc.code)
			}
		}
	}
}

// TestAdminRefusesCrossOriginWrites: a hostile page in the operator's
// browser, while kubectl port-forward exposes the admin port, can send a
// simple form POST to it (the Host is loopback, so the Host check passes).
// Such a request carries Sec-Fetch-Site: cross-site, or an Origin that is
// not the admin port's; it gets 403 from /quitquitquit and /logging, the
// process does not quit and the levels stay. curl and istioctl send
// neither header, and the live view's own requests are same-origin: those
// still work, istioctl's scope:level form included.
func TestAdminRefusesCrossOriginWrites(t *testing.T) {
	var quits atomic.Int32
	levels := logscope.NewLevels(logscope.Filter{})
	s, err := ListenAdmin(context.Background(), "127.0.0.1:0", Config{
		ConfigDump: func() any { return map[string]int{"workloads": 0} },
		Quit:       func() { quits.Add(1) },
		Levels:     levels,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	base := "http://" + s.Addr().String()
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	with := func(k, v string) http.Header {
		h := form.Clone()
		h.Set(k, v)
		return h
	}
	for _, tc := range []struct {
		name string
		hdr  http.Header
	}{
		{"Sec-Fetch-Site: cross-site", with("Sec-Fetch-Site", "cross-site")},
		{"Sec-Fetch-Site: same-site", with("Sec-Fetch-Site", "same-site")},
		{"a foreign Origin", with("Origin", "http://evil.example")},
		{"a foreign Origin on loopback", with("Origin", "http://127.0.0.1:8080")},
		{"Origin null", with("Origin", "null")},
	} {
		for _, path := range []string{"/quitquitquit", "/logging?level=debug", "/logging?level=access:debug", "/logging?reset"} {
			if code, body, _ := do(t, "POST", base+path, tc.hdr); code != http.StatusForbidden {
				t.Errorf("POST %s with %s = %d %q, want 403", path, tc.name, code, body)
			}
		}
	}
	if n := quits.Load(); n != 0 {
		t.Fatalf("cross-origin POST /quitquitquit called the quit hook %d times, want none", n)
	}
	if got := levels.String(); got != "info" {
		t.Errorf("levels after cross-origin POST /logging = %q, want info (unchanged)", got)
	}

	// What curl, istioctl (through kubectl port-forward) and the live view
	// send still works.
	for _, tc := range []struct {
		name, path string
		hdr        http.Header
		body       string
	}{
		{"curl", "/logging?level=debug", nil, "current log level is debug\n"},
		{"istioctl ztunnel-config log --level access:debug", "/logging?level=access:debug", nil, "current log level is access=debug,debug\n"},
		{"same-origin Sec-Fetch-Site", "/logging?level=xds:warn", with("Sec-Fetch-Site", "same-origin"), "current log level is access=debug,xds=warn,debug\n"},
		{"typed URL (Sec-Fetch-Site: none)", "/logging?level=info", with("Sec-Fetch-Site", "none"), "current log level is access=debug,xds=warn,info\n"},
		{"same-origin Origin", "/logging?reset", with("Origin", base), "current log level is info\n"},
	} {
		if code, body, _ := do(t, "POST", base+tc.path, tc.hdr); code != http.StatusOK || body != tc.body {
			t.Errorf("%s: POST %s = %d %q, want 200 %q", tc.name, tc.path, code, body, tc.body)
		}
	}
	if code, body, _ := do(t, "POST", base+"/quitquitquit", nil); code != http.StatusOK || body != "shutdown now\n" {
		t.Errorf("curl -X POST /quitquitquit = %d %q, want 200 shutdown now", code, body)
	}
	if n := quits.Load(); n != 1 {
		t.Errorf("curl -X POST /quitquitquit called the quit hook %d times, want once", n)
	}
}

// TestAdminRefusesUnknownScope: /logging refuses a scope gozt has no
// logger for with 400, and the live levels, which keep one entry per
// scope named, do not grow.
func TestAdminRefusesUnknownScope(t *testing.T) {
	levels := logscope.NewLevels(logscope.Filter{})
	s, err := ListenAdmin(context.Background(), "127.0.0.1:0", Config{
		ConfigDump: func() any { return nil },
		Quit:       func() {},
		Levels:     levels,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	base := "http://" + s.Addr().String()
	for _, q := range []string{"level=nosuchscope:debug", "level=access:debug,x1:debug", "level=ztunnel::nosuch::inbound=trace", "reset&level=x2:info"} {
		if code, body, _ := do(t, "POST", base+"/logging?"+q, nil); code != http.StatusBadRequest || !strings.Contains(body, "unknown scope") {
			t.Errorf("POST /logging?%s = %d %q, want 400 naming the unknown scope", q, code, body)
		}
	}
	if got := levels.String(); got != "info" {
		t.Errorf("levels after unknown scopes = %q, want info (unchanged)", got)
	}
}
