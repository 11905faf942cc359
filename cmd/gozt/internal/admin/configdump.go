package admin

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/cmd/gozt/internal/configdump"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// configDump is /config_dump in the shape istioctl's ztunnel-config reads
// (SPEC §8.2).
type configDump struct {
	Workloads      []configdump.WorkloadJSON                     `json:"workloads"`
	Services       []configdump.ServiceJSON                      `json:"services"`
	Policies       []configdump.PolicyJSON                       `json:"policies"`
	StagedServices map[string]map[string]configdump.EndpointJSON `json:"stagedServices"`
	StaticConfig   any                                           `json:"staticConfig"`
	Version        versionJSON                                   `json:"version"`
	Config         any                                           `json:"config"`
	Certificates   []certJSON                                    `json:"certificates"`
	// WorkloadState is every workload gozt proxies (SPEC §8.2).
	WorkloadState map[string]WorkloadState `json:"workloadState"`
}

// WorkloadState is one workload of /config_dump's workloadState, the list
// `istioctl ztunnel-config connections` reads (SPEC §8.2): a pod istio-cni
// handed over in shared mode, the one workload of dedicated mode, each
// workload of gozt local. ztunnel lists shared mode's pods only; gozt
// lists every mode's workloads, so that the connections view works
// wherever /config_dump does.
type WorkloadState struct {
	// State is "Up", or "Pending" for a pod whose proxy is not running
	// (shared mode).
	State       string       `json:"state"`
	Info        WorkloadInfo `json:"info"`
	Connections Connections  `json:"connections"`
}

// WorkloadInfo names a workload of WorkloadState.
type WorkloadInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	TrustDomain    string `json:"trustDomain"`
	ServiceAccount string `json:"serviceAccount"`
}

// Connections are a workload's open connections, each direction sorted by
// source; never nil, so that they render as [] when there are none.
type Connections struct {
	Inbound  []telemetry.ConnJSON `json:"inbound"`
	Outbound []telemetry.ConnJSON `json:"outbound"`
}

// NoConnections is the Connections of a workload whose proxy is not running.
func NoConnections() Connections {
	return Connections{Inbound: []telemetry.ConnJSON{}, Outbound: []telemetry.ConnJSON{}}
}

// ConnectionsOf returns p's open connections (none unless p keeps their
// list: proxy.Config.ListConnections).
func ConnectionsOf(p *proxy.Proxy) Connections {
	in, out := p.Connections()
	bySrc := func(a, b telemetry.ConnJSON) int { return strings.Compare(a.Src, b.Src) }
	slices.SortFunc(in, bySrc)
	slices.SortFunc(out, bySrc)
	return Connections{Inbound: in, Outbound: out}
}

// InfoOf names w as WorkloadState does; a nil w gives the zero value.
func InfoOf(w *state.Workload) WorkloadInfo {
	if w == nil {
		return WorkloadInfo{}
	}
	id := w.Identity()
	return WorkloadInfo{Name: w.Name, Namespace: w.Namespace, TrustDomain: id.TrustDomain, ServiceAccount: id.ServiceAccount}
}

type versionJSON struct {
	Version        string `json:"version"`
	GitRevision    string `json:"gitRevision"`
	RustVersion    string `json:"rustVersion"`
	BuildProfile   string `json:"buildProfile"`
	BuildStatus    string `json:"buildStatus"`
	IstioVersion   string `json:"istioVersion"`
	CryptoProvider string `json:"cryptoProvider"`
}

type certJSON struct {
	Identity  string         `json:"identity"`
	State     string         `json:"state"`
	CertChain []certItemJSON `json:"certChain"`
	RootCerts []certItemJSON `json:"rootCerts"`
}

type certItemJSON struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

// DumpInput is what /config_dump shows.
type DumpInput struct {
	Snapshot *state.Snapshot
	Static   any // the parsed local config, or nil
	Certs    []certs.State
	Config   any    // the resolved configuration, camelCase keys
	Version  string // gozt's version
	// IstioVersion is ISTIO_META_ISTIO_VERSION ("unknown" when unset).
	IstioVersion string
	// WorkloadState maps the uid of each workload gozt proxies (the ZDS
	// uid in shared mode, the xDS one otherwise) to its state and
	// connections; nil renders as {}.
	WorkloadState map[string]WorkloadState
}

// ConfigDump renders in as /config_dump (SPEC §8.2).
func ConfigDump(in DumpInput) any {
	d := configdump.FromSnapshot(in.Snapshot)
	static := in.Static
	if static == nil {
		static = map[string]any{}
	}
	ws := in.WorkloadState
	if ws == nil {
		ws = map[string]WorkloadState{}
	}
	return configDump{
		Workloads:      d.Workloads,
		Services:       d.Services,
		Policies:       d.Policies,
		StagedServices: d.StagedServices,
		StaticConfig:   static,
		Version: versionJSON{
			Version:        in.Version,
			GitRevision:    "unknown",
			RustVersion:    runtime.Version(), // the field istioctl reads; gozt reports its Go version here
			BuildProfile:   "release",
			BuildStatus:    "Modified",
			IstioVersion:   in.IstioVersion,
			CryptoProvider: "go-crypto-tls",
		},
		Config:        in.Config,
		Certificates:  certificates(in.Certs),
		WorkloadState: ws,
	}
}

// certificates renders the certificate states; private keys never appear
// (TESTPLAN 60).
func certificates(states []certs.State) []certJSON {
	out := make([]certJSON, 0, len(states))
	for _, s := range states {
		cj := certJSON{Identity: s.Identity.String(), State: s.Status, CertChain: []certItemJSON{}, RootCerts: []certItemJSON{}}
		if s.Cert != nil {
			for _, c := range s.Cert.Chain() {
				cj.CertChain = append(cj.CertChain, certItem(c))
			}
			// What gozt trusts now: during a root rotation, old and new
			// roots, whichever the identity's own leaf comes from.
			for _, c := range s.Cert.TrustedRoots() {
				cj.RootCerts = append(cj.RootCerts, certItem(c))
			}
		}
		out = append(out, cj)
	}
	return out
}

func certItem(c *x509.Certificate) certItemJSON {
	p := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	return certItemJSON{
		PEM:            base64.StdEncoding.EncodeToString(p),
		SerialNumber:   c.SerialNumber.String(),
		ValidFrom:      c.NotBefore.UTC().Format(time.RFC3339),
		ExpirationTime: c.NotAfter.UTC().Format(time.RFC3339),
	}
}

// Version is gozt's version: `gozt version` and /config_dump report it.
const Version = "0.1.0-dev"

// BuildInfo is istio_build{component="ztunnel",tag=...} = 1 (SPEC §7.2); tag
// is ISTIO_META_ISTIO_VERSION.
func BuildInfo(tag string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "istio_build", Help: "Istio component build info"},
		[]string{"component", "tag"})
	g.WithLabelValues("ztunnel", tag).Set(1)
	return g
}
