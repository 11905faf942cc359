// Package admin serves gozt's three HTTP/1.1 side ports (SPEC §8): admin
// (15000, localhost only: the live view at /, /config_dump, /quitquitquit,
// /logging, pprof), Prometheus metrics (15020) and readiness (15021). Only
// cmd/gozt imports it.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gozt/gozt/cmd/gozt/internal/logscope"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// headerTimeout bounds reading request headers on every side port (SPEC §1.1).
const headerTimeout = 2 * time.Second

// Config configures the admin server.
type Config struct {
	// ConfigDump returns the value served as JSON by /config_dump. Required.
	ConfigDump func() any
	// Quit is called (once) by POST /quitquitquit to start a graceful
	// shutdown. Required.
	Quit func()
	// Levels, if non-nil, are the live log levels POST /logging lists and
	// changes (SPEC §8.1); nil answers 501.
	Levels *logscope.Levels
	// Handlers are extra endpoints by path (e.g. /debug/authz), or nil.
	Handlers map[string]http.Handler
	// Live, if non-nil, returns what the live view (/ and /debug/live,
	// live.go) shows now; it is called once per poll, every second while
	// the page is open.
	Live func() LiveInput
}

// ErrNotLoopback is returned when the admin address is not a loopback
// address: the admin port must be reachable from this host only (TESTPLAN S28).
var ErrNotLoopback = errors.New("admin: refusing to serve on a non-loopback address")

// Server is one HTTP side server with its own listener.
type Server struct {
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// ListenAdmin binds the admin server; addr must be a loopback address.
func ListenAdmin(ctx context.Context, addr string, cfg Config) (*Server, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("admin: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%w: %s", ErrNotLoopback, addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", serveLivePage)
	mux.HandleFunc("/debug/live", liveHandler(cfg.Live))
	mux.HandleFunc("/config_dump", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(cfg.ConfigDump())
	})
	var quitOnce sync.Once
	mux.HandleFunc("/quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed, use POST", http.StatusMethodNotAllowed)
			return
		}
		fmt.Fprintln(w, "shutdown now")
		quitOnce.Do(cfg.Quit)
	})
	if cfg.Levels != nil {
		mux.Handle("/logging", cfg.Levels)
	} else {
		mux.HandleFunc("/logging", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "log levels are fixed", http.StatusNotImplemented)
		})
	}
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/heap", func(w http.ResponseWriter, r *http.Request) {
		pprof.Handler("heap").ServeHTTP(w, r)
	})
	mux.HandleFunc("/debug/pprof/goroutine", func(w http.ResponseWriter, r *http.Request) {
		pprof.Handler("goroutine").ServeHTTP(w, r)
	})
	for path, h := range cfg.Handlers {
		mux.Handle(path, h)
	}
	return listen(ctx, addr, loopbackHostOnly(sameOriginWrites(mux)))
}

// sameOriginWrites refuses, with 403, a cross-origin request that is not
// GET, HEAD or OPTIONS: what a hostile page in the operator's browser
// sends as a simple form POST to /quitquitquit or /logging while kubectl
// port-forward exposes the admin port. Its Host is loopback, so
// loopbackHostOnly lets it through, and a form POST needs no CORS
// preflight; but the browser marks it with Sec-Fetch-Site (cross-site or
// same-site) or, in browsers older than 2023, an Origin that is not the
// admin port's. curl and istioctl send neither header and pass, as do the
// live view's own same-origin requests. gozt only: ztunnel does not check.
func sameOriginWrites(h http.Handler) http.Handler {
	return http.NewCrossOriginProtection().Handler(h)
}

// loopbackHostOnly refuses, with 403, a request whose Host is not this
// host's loopback (localhost, 127.0.0.0/8 or ::1, any port). The admin
// port listens on loopback only, but a browser on the same host follows a
// hostile page's DNS rebinding to it: its requests then carry the hostile
// name in Host, so the page cannot read /config_dump or /debug/live.
// istioctl (through kubectl port-forward), curl and the live view send a
// loopback Host. gozt only: ztunnel does not check.
func loopbackHostOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			http.Error(w, "admin: the Host header must name this host's loopback (localhost, 127.0.0.1, [::1])", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ListenMetrics binds the Prometheus endpoint (/metrics and
// /stats/prometheus) for reg.
func ListenMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (*Server, error) {
	prom := promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	// ztunnel answers OpenMetrics 1.0.0 whenever Accept lists
	// application/openmetrics-text, else text (SPEC §7); promhttp alone
	// would answer 0.0.1 to a bare application/openmetrics-text.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Accept"), ",")), "application/openmetrics-text") {
			r = r.Clone(r.Context())
			r.Header.Set("Accept", "application/openmetrics-text;version=1.0.0")
		}
		prom.ServeHTTP(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	mux.Handle("/stats/prometheus", h)
	return listen(ctx, addr, mux)
}

// Readiness tracks what still blocks readiness (SPEC §8.3): named
// blockers, set and cleared, and conditions, asked at each request.
type Readiness struct {
	mu       sync.Mutex
	blockers map[string]struct{}
	conds    []readinessCond
}

// readinessCond is a blocker named name while blocked reports true.
type readinessCond struct {
	name    string
	blocked func() bool
}

// NewReadiness returns a tracker blocked on the named tasks.
func NewReadiness(blockers ...string) *Readiness {
	r := &Readiness{blockers: make(map[string]struct{})}
	for _, b := range blockers {
		r.blockers[b] = struct{}{}
	}
	return r
}

// Block adds a blocker; Unblock removes it.
func (r *Readiness) Block(name string) {
	r.mu.Lock()
	r.blockers[name] = struct{}{}
	r.mu.Unlock()
}

// Unblock removes a blocker.
func (r *Readiness) Unblock(name string) {
	r.mu.Lock()
	delete(r.blockers, name)
	r.mu.Unlock()
}

// BlockWhile makes name a blocker whenever blocked reports true; blocked
// is called for every readiness request and must be cheap. gozt's own
// conditions (file descriptors or memory exhausted) are not ztunnel's,
// whose readiness tracks start-up tasks only.
func (r *Readiness) BlockWhile(name string, blocked func() bool) {
	r.mu.Lock()
	r.conds = append(r.conds, readinessCond{name, blocked})
	r.mu.Unlock()
}

// Pending returns the sorted names of the remaining blockers.
func (r *Readiness) Pending() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.blockers))
	for n := range r.blockers {
		names = append(names, n)
	}
	for _, c := range r.conds {
		if _, dup := r.blockers[c.name]; !dup && c.blocked() {
			names = append(names, c.name)
		}
	}
	sort.Strings(names)
	return names
}

// ListenReadiness binds the readiness endpoint /healthz/ready.
func ListenReadiness(ctx context.Context, addr string, r *Readiness) (*Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if p := r.Pending(); len(p) > 0 {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "not ready, pending: %s\n", strings.Join(p, ", "))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return listen(ctx, addr, mux)
}

// listen serves h on addr, a plain TCP listener as ztunnel's (not Go's
// default Multipath TCP, as for the proxies' listeners: sockopt.ListenConfig).
func listen(ctx context.Context, addr string, h http.Handler) (*Server, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", addr, err)
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout}}
	s.srv.SetKeepAlivesEnabled(true)
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	_ = s.srv.Serve(s.ln)
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Shutdown stops the server, waiting for requests until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	s.wg.Wait()
	return err
}

// Addrs are the three side-port addresses.
type Addrs struct {
	Admin, Metrics, Readiness string
}

// Ports are the three running side servers.
type Ports struct {
	Admin, Metrics, Readiness *Server
}

// ListenAll binds the admin, metrics and readiness servers. On error none is
// left running.
func ListenAll(ctx context.Context, addrs Addrs, cfg Config, reg *prometheus.Registry, ready *Readiness) (_ *Ports, err error) {
	p := &Ports{}
	defer func() {
		if err != nil {
			p.Shutdown(context.Background())
		}
	}()
	if p.Admin, err = ListenAdmin(ctx, addrs.Admin, cfg); err != nil {
		return nil, err
	}
	if p.Metrics, err = ListenMetrics(ctx, addrs.Metrics, reg); err != nil {
		return nil, err
	}
	if p.Readiness, err = ListenReadiness(ctx, addrs.Readiness, ready); err != nil {
		return nil, err
	}
	return p, nil
}

// Shutdown stops every running server, each within a second at most.
func (p *Ports) Shutdown(ctx context.Context) {
	if p == nil {
		return
	}
	for _, s := range []*Server{p.Admin, p.Metrics, p.Readiness} {
		if s == nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = s.Shutdown(sctx)
		cancel()
	}
}
