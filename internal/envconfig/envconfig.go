// Package envconfig reads ztunnel's environment variables (SPEC §0.3) into
// one Config for `gozt proxy`. Every bad value is an error naming the
// variable, so start-up stops with one clear line. Config.Proxy then builds
// each proxy's proxy.Config from it, for every mode (build.go).
//
// Only cmd/gozt and the benchmark's gozt role (bench) import it. It lives
// outside cmd/gozt so that the bench, which may not import cmd, runs a gozt
// configured as production's.
package envconfig

import (
	"crypto/fips140"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Proxy modes (PROXY_MODE).
const (
	ModeShared    = "shared"
	ModeDedicated = "dedicated"
	// ModeLocal is `gozt local`'s (LoadLocal), never PROXY_MODE's.
	ModeLocal = "local"
)

// Config is the resolved configuration of `gozt proxy`.
type Config struct {
	ProxyMode string `json:"proxyMode"`
	// Workload is PROXY_WORKLOAD_INFO (dedicated mode): namespace, name, service account.
	WorkloadNamespace      string `json:"workloadNamespace"`
	WorkloadName           string `json:"workloadName"`
	WorkloadServiceAccount string `json:"workloadServiceAccount"`

	XDSAddress      string            `json:"xdsAddress"` // "" disables xDS
	CAAddress       string            `json:"caAddress"`
	XDSRootCA       string            `json:"xdsRootCA"` // path, "SYSTEM", or inline PEM
	CARootCA        string            `json:"caRootCA"`
	CRLPath         string            `json:"crlPath"` // CRL_PATH: peer revocation lists, "" for none
	AltXDSHostname  string            `json:"altXDSHostname"`
	AltCAHostname   string            `json:"altCAHostname"`
	AuthToken       string            `json:"-"` // path of the token file, or a static token (AuthTokenIsFile tells)
	AuthTokenIsFile bool              `json:"authTokenIsFile"`
	XDSHeaders      map[string]string `json:"xdsHeaders"`
	CAHeaders       map[string]string `json:"caHeaders"`
	ClusterID       string            `json:"clusterID"`
	ClusterDomain   string            `json:"clusterDomain"`
	Network         string            `json:"network"`
	NodeName        string            `json:"nodeName"`
	PodName         string            `json:"podName"`
	PodNamespace    string            `json:"podNamespace"`
	ServiceAccount  string            `json:"serviceAccount"`
	TrustDomain     string            `json:"trustDomain"`
	InstanceIP      string            `json:"instanceIP"`
	SecretTTL       time.Duration     `json:"secretTTL"`
	DrainDeadline   time.Duration     `json:"drainDeadline"`
	LocalXDSPath    string            `json:"localXDSPath"`
	LocalXDS        string            `json:"localXDS"`
	XDSOnDemand     bool              `json:"xdsOnDemand"` // XDS_ON_DEMAND
	Meta            map[string]string `json:"meta"`        // ISTIO_META_* (prefix stripped)
	MetaJSON        map[string]any    `json:"metaJSON"`    // ISTIO_METAJSON_*
	IstioVersion    string            `json:"istioVersion"`

	PoolMaxStreams  int           `json:"poolMaxStreams"`
	PoolIdleTimeout time.Duration `json:"poolIdleTimeout"`
	StreamWindow    uint32        `json:"windowSize"`
	ConnWindow      uint32        `json:"connectionWindowSize"`
	FrameSize       uint32        `json:"frameSize"`
	EnableOrigSrc   *bool         `json:"enableOrigSrc"` // nil = auto
	PacketMark      uint32        `json:"packetMark"`
	EnableSOCKS5    bool          `json:"enableSOCKS5"`
	// InpodUDS is istio-cni's ZDS socket (shared mode, SPEC §9).
	InpodUDS string `json:"inpodUds"`
	// InpodPortReuse sets SO_REUSEPORT on in-pod listeners (upgrade overlap).
	InpodPortReuse bool `json:"inpodPortReuse"`
	IPv6Enabled    bool `json:"ipv6Enabled"`
	// TCP keep-alive of upstream and captured sockets (KEEPALIVE_*).
	KeepaliveEnabled  bool          `json:"keepaliveEnabled"`
	KeepaliveTime     time.Duration `json:"keepaliveTime"`
	KeepaliveInterval time.Duration `json:"keepaliveInterval"`
	KeepaliveRetries  int           `json:"keepaliveRetries"`
	// Workers decides the worker thread count (GOMAXPROCS).
	Workers   Workers `json:"workers"`
	LogFormat string  `json:"logFormat"`

	// TrustWaypointForwarded (TRUST_WAYPOINT_FORWARDED, gozt only) takes
	// the inbound source from the Forwarded for= IP that the destination's
	// own waypoint sends (SPEC §2.5); false ignores it, as ztunnel does.
	TrustWaypointForwarded bool `json:"trustWaypointForwarded"`
	// EarlyData (HBONE_EARLY_DATA, gozt only, default true) sends a
	// client's first bytes with the outbound CONNECT instead of after its
	// 200; false waits, as ztunnel does.
	EarlyData bool `json:"hboneEarlyData"`
	// LocalhostAppTunnel (LOCALHOST_APP_TUNNEL, default true) delivers
	// PROXY-protocol application tunnels over the pod's loopback; false
	// sends them to the pod IP (SPEC §2.7).
	LocalhostAppTunnel bool `json:"localhostAppTunnel"`

	// DNSCapture is the DNS_CAPTURE proxy metadata (ISTIO_META_DNS_CAPTURE):
	// each workload's DNS proxy runs unless it is set to anything but
	// "true" (any case), as in ztunnel.
	DNSCapture bool `json:"dnsCapture"`
	// DNSProxyAddr is the DNS_PROXY_ADDR proxy metadata
	// (ISTIO_META_DNS_PROXY_ADDR): "localhost:PORT" (127.0.0.1, and ::1
	// with IPv6) or "IP:PORT"; default localhost:15053. DNSListenAddrs
	// resolves it.
	DNSProxyAddr string `json:"dnsProxyAddr"`
	// PreferredServiceNamespace is PREFERED_SERVICE_NAMESPACE (sic): the
	// namespace whose service answers a hostname several namespaces define.
	PreferredServiceNamespace string `json:"preferedServiceNamespace"`

	// EnableProxy (ENABLE_PROXY, default true) runs the 15001, 15006 and
	// 15008 (and SOCKS5) listeners; false leaves each workload only its DNS
	// proxy, and then the DNS proxy must be on.
	EnableProxy bool `json:"proxy"`
	// ResponseBaggage (ENABLE_RESPONSE_BAGGAGE, default true) sends the
	// local workload's baggage on inbound HBONE responses (SPEC §2.3).
	ResponseBaggage bool `json:"enableEnhancedBaggage"`
	// UserTimeoutEnabled (USER_TIMEOUT_ENABLED, default false) sets
	// TCP_USER_TIMEOUT where keep-alive applies; UserTimeout gives it.
	UserTimeoutEnabled bool `json:"userTimeoutEnabled"`
	// AuthzPolicyInfoLogging (AUTHZ_POLICY_INFO_LOGGING, default false)
	// logs each authorization decision at info instead of debug.
	AuthzPolicyInfoLogging bool `json:"authzPolicyInfoLogging"`
	// TLS12Enabled (TLS12_ENABLED, default false) also accepts TLS 1.2 with
	// ECDHE AES-GCM suites on HBONE.
	TLS12Enabled bool `json:"tls12Enabled"`
	// CompliancePolicy is COMPLIANCE_POLICY: "", CompliancePQC or
	// ComplianceFIPS (the last only when Go's FIPS 140-3 mode is on).
	CompliancePolicy string `json:"compliancePolicy"`
	// MetricsSeriesGrace (METRICS_SERIES_GRACE, gozt only, default 5m) is
	// how long a traffic series naming a workload gone from the store stays
	// unchanged, with no connection open, before it is deleted
	// (telemetry.MetricsConfig.SeriesGrace).
	MetricsSeriesGrace time.Duration `json:"metricsSeriesGrace"`
	// MetricsMaxSeries (METRICS_MAX_SERIES, gozt only, default 20000)
	// bounds the label sets of each istio_tcp_* counter
	// (telemetry.MetricsConfig.MaxSeries).
	MetricsMaxSeries int `json:"metricsMaxSeries"`
	// RootRotationGrace (ROOT_ROTATION_GRACE, gozt only, default 24h) is
	// how long, at most, a root the CA stopped answering stays trusted
	// for peers (certs.ManagerConfig.RootGrace); it goes sooner once
	// every leaf known to need it has expired.
	RootRotationGrace time.Duration `json:"rootRotationGrace"`
	// AdminPort and StatsPort are ProxyConfig's proxyAdminPort and
	// statsPort (15000 and 15020 if unset).
	AdminPort uint16 `json:"adminPort"`
	StatsPort uint16 `json:"statsPort"`
}

// UserTimeout is the TCP_USER_TIMEOUT ztunnel sets with
// USER_TIMEOUT_ENABLED: KEEPALIVE_TIME + KEEPALIVE_RETRIES ×
// KEEPALIVE_INTERVAL (whether or not keep-alive itself is on); 0 when
// disabled.
func (c Config) UserTimeout() time.Duration {
	if !c.UserTimeoutEnabled {
		return 0
	}
	return c.KeepaliveTime + time.Duration(c.KeepaliveRetries)*c.KeepaliveInterval
}

// Load resolves the configuration from environ (os.Environ in production)
// and the mesh config file at MeshConfigPath, if there is one.
func Load(environ []string) (Config, error) {
	return load(environ, MeshConfigPath)
}

func load(environ []string, meshPath string) (Config, error) {
	l := loader{vars: make(map[string]string, len(environ))}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		l.vars[k] = v
	}
	c := Config{
		ProxyMode:       l.str("PROXY_MODE", ModeShared),
		ClusterDomain:   l.str("CLUSTER_DOMAIN", "cluster.local"),
		Network:         l.str("NETWORK", ""),
		NodeName:        l.str("NODE_NAME", ""),
		PodName:         l.str("POD_NAME", ""),
		PodNamespace:    l.str("POD_NAMESPACE", ""),
		ServiceAccount:  l.str("SERVICE_ACCOUNT", ""),
		TrustDomain:     l.str("TRUST_DOMAIN", "cluster.local"),
		InstanceIP:      l.str("INSTANCE_IP", "1.1.1.1"),
		AltXDSHostname:  l.str("ALT_XDS_HOSTNAME", ""),
		AltCAHostname:   l.str("ALT_CA_HOSTNAME", ""),
		XDSRootCA:       l.str("XDS_ROOT_CA", "./var/run/secrets/istio/root-cert.pem"),
		CARootCA:        l.str("CA_ROOT_CA", "./var/run/secrets/istio/root-cert.pem"),
		LocalXDSPath:    l.str("LOCAL_XDS_PATH", ""),
		LocalXDS:        l.str("LOCAL_XDS", ""),
		LogFormat:       l.str("LOG_FORMAT", "plain"),
		SecretTTL:       l.duration("SECRET_TTL", 24*time.Hour),
		PoolMaxStreams:  l.positiveInt("POOL_MAX_STREAMS_PER_CONNECTION", 100),
		PoolIdleTimeout: l.duration("POOL_UNUSED_RELEASE_TIMEOUT", 5*time.Minute),
		StreamWindow:    l.window("HTTP2_STREAM_WINDOW_SIZE", 4<<20),
		ConnWindow:      l.window("HTTP2_CONNECTION_WINDOW_SIZE", 16<<20),
		FrameSize:       l.frameSize("HTTP2_FRAME_SIZE", 1<<20),
		EnableSOCKS5:    l.boolean("UNSTABLE_ENABLE_SOCKS5", false),
		IPv6Enabled:     l.boolean("IPV6_ENABLED", true),
		EnableOrigSrc:   l.optBool("ENABLE_ORIG_SRC"),
		InpodUDS:        l.str("INPOD_UDS", "/var/run/ztunnel/ztunnel.sock"),
		InpodPortReuse:  l.boolean("INPOD_PORT_REUSE", true),

		KeepaliveEnabled:  l.boolean("KEEPALIVE_ENABLED", true),
		KeepaliveTime:     l.duration("KEEPALIVE_TIME", 180*time.Second),
		KeepaliveInterval: l.duration("KEEPALIVE_INTERVAL", 180*time.Second),
		KeepaliveRetries:  l.positiveInt("KEEPALIVE_RETRIES", 9),
	}
	pc := loadProxyConfig(&l, meshPath)
	c.Workers = loadWorkers(&l)
	c.Workers.Concurrency = pc.Concurrency
	c.AdminPort, c.StatsPort = portOr(pc.ProxyAdminPort, 15000), portOr(pc.StatsPort, 15020)
	c.TrustWaypointForwarded = l.boolean("TRUST_WAYPOINT_FORWARDED", true)
	c.EarlyData = l.boolean("HBONE_EARLY_DATA", true)
	c.LocalhostAppTunnel = l.boolean("LOCALHOST_APP_TUNNEL", true)
	c.MetricsSeriesGrace = l.duration("METRICS_SERIES_GRACE", 5*time.Minute)
	c.MetricsMaxSeries = l.positiveInt("METRICS_MAX_SERIES", 20_000)
	c.RootRotationGrace = l.duration("ROOT_ROTATION_GRACE", 24*time.Hour)
	var envMeta map[string]string
	envMeta, c.MetaJSON, c.XDSHeaders, c.CAHeaders = prefixed(&l, environ)
	c.Meta = pc.metadata(envMeta)
	c.resolveDNS(&l)
	// ztunnel reads these two from the environment only.
	c.IstioVersion = orDefault(envMeta["ISTIO_VERSION"], "unknown")
	c.ClusterID = orDefault(envMeta["CLUSTER_ID"], l.str("CLUSTER_ID", "Kubernetes"))
	c.resolveMode(&l)
	c.resolveAddresses(&l, pc.DiscoveryAddress)
	c.resolveFeatures(&l)
	c.resolveToken(&l)
	c.resolveDrain(&l)
	c.resolveMark(&l)
	if _, err := netip.ParseAddr(c.InstanceIP); err != nil {
		l.fail("INSTANCE_IP", "not an IP address: %q", c.InstanceIP)
	}
	if c.LocalXDSPath != "" && c.LocalXDS != "" {
		l.fail("LOCAL_XDS", "LOCAL_XDS and LOCAL_XDS_PATH are mutually exclusive")
	}
	c.checkLogFormat(&l)
	// Istio's chart sets CRL_PATH only with peerCaCrl.enabled.
	c.CRLPath = l.get("CRL_PATH")
	if l.boolean("FAKE_CA", false) {
		l.fail("FAKE_CA", "gozt has no insecure fake CA; certificates always come from CA_ADDRESS")
	}
	// On-demand Address subscriptions (SPEC §5.3); ztunnel's
	// validate_config (src/config.rs) refuses them with its DNS proxy,
	// which answers from the full set of services.
	c.XDSOnDemand = l.boolean("XDS_ON_DEMAND", false)
	if c.XDSOnDemand && c.DNSCapture {
		l.fail("XDS_ON_DEMAND", "the DNS proxy (ISTIO_META_DNS_CAPTURE, on by default) does not support on-demand mode; set ISTIO_META_DNS_CAPTURE=false")
	}
	return c, l.err
}

func (c *Config) resolveMode(l *loader) {
	switch c.ProxyMode {
	case ModeShared:
	case ModeDedicated:
		info := l.str("PROXY_WORKLOAD_INFO", "")
		parts := strings.Split(info, "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			l.fail("PROXY_WORKLOAD_INFO", "dedicated mode needs namespace/name/serviceaccount, got %q", info)
			return
		}
		c.WorkloadNamespace, c.WorkloadName, c.WorkloadServiceAccount = parts[0], parts[1], parts[2]
	default:
		l.fail("PROXY_MODE", "must be shared or dedicated, not %q", c.ProxyMode)
	}
}

// resolveAddresses applies the XDS_ADDRESS / CA_ADDRESS defaults: istiod in
// Kubernetes, else localhost; https:// prepended when the scheme is missing.
// XDS_ADDRESS falls back on ProxyConfig's discoveryAddress (CA_ADDRESS does
// not), and an empty one disables xDS.
//
// An empty CA_ADDRESS is refused. ztunnel, too, reads it as "no CA" and
// then, without FAKE_CA, panics at start-up ("ca_address must be set to
// use CA"); its config deliberately never turns an empty address into the
// fake CA. gozt says so in one line instead, and has no fake CA to fall
// back on: every certificate comes from a CA over TLS.
func (c *Config) resolveAddresses(l *loader, discovery *string) {
	def := "https://localhost:15012"
	if l.get("KUBERNETES_SERVICE_HOST") != "" {
		def = "https://istiod.istio-system.svc:15012"
	}
	xdsDef := def
	if discovery != nil {
		xdsDef = l.addressValue("ProxyConfig discoveryAddress", *discovery)
	}
	c.XDSAddress = l.address("XDS_ADDRESS", xdsDef)
	if v, present := l.vars["XDS_ADDRESS"]; present && v == "" {
		c.XDSAddress = "" // explicitly empty disables xDS (SPEC §0.3)
	}
	c.CAAddress = l.address("CA_ADDRESS", def)
	if _, present := l.vars["CA_ADDRESS"]; present && l.get("CA_ADDRESS") == "" {
		l.fail("CA_ADDRESS", "empty: ztunnel has no CA then and gozt refuses to start without one (it has no insecure fake CA)")
	}
}

// Compliance policies (COMPLIANCE_POLICY).
const (
	// CompliancePQC restricts TLS key exchange to X25519MLKEM768, as
	// ztunnel's aws-lc build does.
	CompliancePQC = "pqc"
	// ComplianceFIPS is Istio's FIPS 140-2 policy. ztunnel gets FIPS from
	// its boring build, not from the variable; gozt honours it only when Go's
	// FIPS 140-3 mode is on (GODEBUG=fips140=on or only), which the Go
	// runtime fixes at process start and no program can switch on later.
	ComplianceFIPS = "fips-140-2"
)

// resolveFeatures reads the switches ztunnel reads outside its socket and
// address settings: ENABLE_PROXY, ENABLE_RESPONSE_BAGGAGE,
// USER_TIMEOUT_ENABLED, AUTHZ_POLICY_INFO_LOGGING, TLS12_ENABLED and
// COMPLIANCE_POLICY.
func (c *Config) resolveFeatures(l *loader) {
	c.EnableProxy = l.boolean("ENABLE_PROXY", true)
	c.ResponseBaggage = l.boolean("ENABLE_RESPONSE_BAGGAGE", true)
	c.UserTimeoutEnabled = l.boolean("USER_TIMEOUT_ENABLED", false)
	c.AuthzPolicyInfoLogging = l.boolean("AUTHZ_POLICY_INFO_LOGGING", false)
	c.TLS12Enabled = l.boolean("TLS12_ENABLED", false)
	if !c.EnableProxy && !c.DNSCapture {
		l.fail("ENABLE_PROXY", "false with the DNS proxy off (DNS_CAPTURE) leaves nothing to run")
	}
	switch c.CompliancePolicy = l.str("COMPLIANCE_POLICY", ""); c.CompliancePolicy {
	case "", CompliancePQC:
	case ComplianceFIPS:
		if !fips140Enabled() {
			l.fail("COMPLIANCE_POLICY", "%s needs Go's FIPS 140-3 mode, which is fixed at process start: set GODEBUG=fips140=on", ComplianceFIPS)
		}
	default:
		l.fail("COMPLIANCE_POLICY", "must be empty, %s or %s, not %q", CompliancePQC, ComplianceFIPS, c.CompliancePolicy)
	}
}

// fips140Enabled reports whether Go's FIPS 140-3 mode is on; a variable so
// tests can pretend.
var fips140Enabled = fips140.Enabled

func portOr(p *uint16, def uint16) uint16 {
	if p == nil || *p == 0 {
		return def
	}
	return *p
}

func (c *Config) resolveToken(l *loader) {
	const defPath = "./var/run/secrets/tokens/istio-token"
	v := l.get("AUTH_TOKEN")
	switch {
	case v == "":
		if _, err := os.Stat(defPath); err == nil {
			c.AuthToken, c.AuthTokenIsFile = defPath, true
		}
	default:
		_, err := os.Stat(v)
		c.AuthToken, c.AuthTokenIsFile = v, err == nil
	}
}

// LoadLocal returns the configuration of `gozt local`: Default's, but for
// the variables local mode reads from environ (NETWORK, LOG_FORMAT and the
// drain deadline's, by Load's rules and with its errors, so that the two
// modes read a variable alike) and for local mode's own two defaults:
// SOCKS5 on, the demo's way in, and no packet mark, as there are no pod
// iptables rules to skip and local mode runs unprivileged. It reads no
// other variable.
func LoadLocal(environ []string) (Config, error) {
	l := loader{vars: make(map[string]string)}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		l.vars[k] = v
	}
	c := Default()
	c.ProxyMode, c.EnableSOCKS5, c.PacketMark = ModeLocal, true, 0
	c.Network = l.str("NETWORK", "")
	c.LogFormat = l.str("LOG_FORMAT", "plain")
	c.resolveDrain(&l)
	c.checkLogFormat(&l)
	return c, l.err
}

func (c *Config) checkLogFormat(l *loader) {
	if c.LogFormat != "plain" && c.LogFormat != "json" {
		l.fail("LOG_FORMAT", "must be plain or json, not %q", c.LogFormat)
	}
}

// resolveDrain: CONNECTION_TERMINATION_DEADLINE, else from
// TERMINATION_GRACE_PERIOD_SECONDS (secs−5 if >10 else secs−1, ≥1s), else 5s.
func (c *Config) resolveDrain(l *loader) {
	c.DrainDeadline = 5 * time.Second
	if l.get("CONNECTION_TERMINATION_DEADLINE") != "" {
		c.DrainDeadline = l.duration("CONNECTION_TERMINATION_DEADLINE", 0)
		return
	}
	if v := l.get("TERMINATION_GRACE_PERIOD_SECONDS"); v != "" {
		secs, err := strconv.Atoi(v)
		if err != nil || secs < 0 {
			l.fail("TERMINATION_GRACE_PERIOD_SECONDS", "not a non-negative integer: %q", v)
			return
		}
		if secs > 10 {
			secs -= 5
		} else {
			secs--
		}
		c.DrainDeadline = time.Duration(max(secs, 1)) * time.Second
	}
}

func (c *Config) resolveMark(l *loader) {
	def := ""
	if c.ProxyMode == ModeShared {
		def = "1337"
	}
	v := l.str("PACKET_MARK", def)
	if v == "" {
		return
	}
	n, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		l.fail("PACKET_MARK", "not a 32-bit integer: %q", v)
		return
	}
	c.PacketMark = uint32(n)
}

// resolveDNS reads the DNS proxy's proxy metadata (SPEC §0.3) and
// PREFERED_SERVICE_NAMESPACE.
func (c *Config) resolveDNS(l *loader) {
	capture, set := c.Meta["DNS_CAPTURE"]
	c.DNSCapture = !set || strings.EqualFold(capture, "true")
	c.DNSProxyAddr = orDefault(c.Meta["DNS_PROXY_ADDR"], "localhost:15053")
	if _, err := c.dnsListenAddrs(); err != nil {
		l.fail("ISTIO_META_DNS_PROXY_ADDR", "%v", err)
	}
	c.PreferredServiceNamespace = l.str("PREFERED_SERVICE_NAMESPACE", "")
}

// DNSListenAddrs returns the addresses DNSProxyAddr names: for
// "localhost:PORT" 127.0.0.1 and, when IPv6 is enabled, ::1.
func (c Config) DNSListenAddrs() []netip.AddrPort {
	addrs, _ := c.dnsListenAddrs()
	return addrs
}

func (c Config) dnsListenAddrs() ([]netip.AddrPort, error) {
	if port, ok := strings.CutPrefix(c.DNSProxyAddr, "localhost:"); ok {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("not localhost:PORT or IP:PORT: %q", c.DNSProxyAddr)
		}
		addrs := []netip.AddrPort{netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(n))}
		if c.IPv6Enabled {
			addrs = append(addrs, netip.AddrPortFrom(netip.IPv6Loopback(), uint16(n)))
		}
		return addrs, nil
	}
	ap, err := netip.ParseAddrPort(c.DNSProxyAddr)
	if err != nil {
		return nil, fmt.Errorf("not localhost:PORT or IP:PORT: %q", c.DNSProxyAddr)
	}
	return []netip.AddrPort{ap}, nil
}

// prefixed collects ISTIO_META_*, ISTIO_METAJSON_*, XDS_HEADER_* and CA_HEADER_*.
func prefixed(l *loader, environ []string) (meta map[string]string, metaJSON map[string]any, xdsH, caH map[string]string) {
	meta, metaJSON = map[string]string{}, map[string]any{}
	xdsH, caH = map[string]string{}, map[string]string{}
	sort.Strings(environ)
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "ISTIO_METAJSON_"):
			var x any
			if err := json.Unmarshal([]byte(v), &x); err != nil {
				l.fail(k, "not JSON: %v", err)
				continue
			}
			metaJSON[strings.TrimPrefix(k, "ISTIO_METAJSON_")] = x
		case strings.HasPrefix(k, "ISTIO_META_"):
			meta[strings.TrimPrefix(k, "ISTIO_META_")] = v
		case strings.HasPrefix(k, "XDS_HEADER_"):
			xdsH[strings.ToLower(strings.TrimPrefix(k, "XDS_HEADER_"))] = v
		case strings.HasPrefix(k, "CA_HEADER_"):
			caH[strings.ToLower(strings.TrimPrefix(k, "CA_HEADER_"))] = v
		}
	}
	return meta, metaJSON, xdsH, caH
}

// loader reads variables and keeps the first error.
type loader struct {
	vars map[string]string
	err  error
}

func (l *loader) get(name string) string { return l.vars[name] }

// ErrInvalid is wrapped by every configuration error.
var ErrInvalid = errors.New("invalid environment")

func (l *loader) fail(name, format string, args ...any) {
	if l.err == nil {
		l.err = fmt.Errorf("%w: %s: %s", ErrInvalid, name, fmt.Sprintf(format, args...))
	}
}

func (l *loader) str(name, def string) string {
	if v, ok := l.lookup(name); ok {
		return v
	}
	return def
}

func (l *loader) lookup(name string) (string, bool) {
	v := l.get(name)
	return v, v != ""
}

func (l *loader) duration(name string, def time.Duration) time.Duration {
	v, ok := l.lookup(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		l.fail(name, "not a positive duration like 5s or 24h: %q", v)
		return def
	}
	return d
}

func (l *loader) positiveInt(name string, def int) int {
	v, ok := l.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		l.fail(name, "not a positive integer: %q", v)
		return def
	}
	return n
}

// window reads an HTTP/2 window size: 1 .. 2^31-1 (RFC 9113 §6.9.1).
func (l *loader) window(name string, def uint32) uint32 {
	v, ok := l.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 || n > 1<<31-1 {
		l.fail(name, "not a window size in 1..2147483647: %q", v)
		return def
	}
	return uint32(n)
}

// frameSize reads SETTINGS_MAX_FRAME_SIZE: 16384 .. 16777215 (RFC 9113 §6.5.2).
func (l *loader) frameSize(name string, def uint32) uint32 {
	v, ok := l.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n < 1<<14 || n > 1<<24-1 {
		l.fail(name, "not a frame size in 16384..16777215: %q", v)
		return def
	}
	return uint32(n)
}

func (l *loader) boolean(name string, def bool) bool {
	b := l.optBool(name)
	if b == nil {
		return def
	}
	return *b
}

func (l *loader) optBool(name string) *bool {
	v, ok := l.lookup(name)
	if !ok {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		l.fail(name, "not a boolean: %q", v)
		return nil
	}
	return &b
}

// address reads an xDS/CA address: "https://" is prepended without a scheme;
// any scheme but https is refused. An explicitly empty value is "".
func (l *loader) address(name, def string) string {
	v, ok := l.lookup(name)
	if !ok {
		return def
	}
	return l.addressValue(name, v)
}

// addressValue checks v as address does; "" stays "" (disabled).
func (l *loader) addressValue(name, v string) string {
	if v == "" {
		return ""
	}
	if !strings.Contains(v, "://") {
		v = "https://" + v
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		l.fail(name, "must be an https:// address, got %q", v)
		return ""
	}
	return v
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
