package logscope

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeHTTP drives /logging with the exact requests istioctl
// ztunnel-config log sends (checked against istioctl's source below) and
// with ztunnel's own forms.
func TestServeHTTP(t *testing.T) {
	start, err := Parse("info")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewLevels(start))
	defer srv.Close()
	for _, tc := range []struct {
		cmd, method, path string // cmd: the istioctl command line that sends path
		code              int
		body              string
	}{
		{"", "GET", "/logging", 405, "usage: POST /logging"},
		{"istioctl ztunnel-config log POD", "POST", "/logging", 200, "current log level is info\n"},
		{"istioctl ztunnel-config log POD --level access:debug,info", "POST", "/logging?level=access:debug,info", 200,
			"current log level is access=debug,info\n"},
		{"istioctl ztunnel-config log POD --level warning", "POST", "/logging?level=warn", 200,
			"current log level is access=debug,warn\n"},
		{"istioctl ztunnel-config log POD --level xds:critical", "POST", "/logging?level=xds:critical", 200,
			"current log level is access=debug,xds=error,warn\n"},
		{"istioctl ztunnel-config log POD --level critical", "POST", "/logging?level=error", 200,
			"current log level is access=debug,xds=error,error\n"},
		{"istioctl ztunnel-config log POD --level off", "POST", "/logging?level=off", 200,
			"current log level is access=debug,xds=error,off\n"},
		{"", "POST", "/logging?level=ztunnel::proxy=trace", 200, "current log level is access=debug,proxy=debug,xds=error,off\n"},
		{"istioctl ztunnel-config log POD --reset", "POST", "/logging?level=info&reset", 200,
			"current log level is info\n"},
		{"", "POST", "/logging?reset", 200, "current log level is info\n"},
		{"", "POST", "/logging?level=verbose", 400, "hint: level: error|warn|info|debug|trace|off"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.body) {
			t.Errorf("%s (%s %s) = %d %q, want %d containing %q", tc.cmd, tc.method, tc.path, resp.StatusCode, b, tc.code, tc.body)
		}
	}
}

// TestIstioctlQueries checks that istioctl (the version go.mod requires)
// still builds /logging's query the way TestServeHTTP assumes: "level="
// plus the --level value with only a whole "warning" or "critical" mapped,
// "&reset" appended, and --reset sending level "info".
func TestIstioctlQueries(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	if err != nil {
		t.Fatalf("go list -m istio.io/istio: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "istioctl/pkg/ztunnelconfig/ztunnelconfig.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`q := "level=" + ztunnelLogLevel(loggerLevelString)`,
		`q += "&reset"`,
		`loggerLevelString = "info"`,
		`case "warning":
		return "warn"`,
		`case "critical":
		return "error"`,
		`path = path + "?" + param`,
		`"POST", path`,
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("istioctl's ztunnelconfig.go no longer contains %q: re-read how it builds /logging's query", want)
		}
	}
}
