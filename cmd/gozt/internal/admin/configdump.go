package admin

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"github.com/prometheus/client_golang/prometheus"
	"runtime"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/proxy/state"
)

// configDump is /config_dump in the shape istioctl's ztunnel-config reads
// (SPEC §8.2).
type configDump struct {
	Workloads      []state.WorkloadJSON                     `json:"workloads"`
	Services       []state.ServiceJSON                      `json:"services"`
	Policies       []state.PolicyJSON                       `json:"policies"`
	StagedServices map[string]map[string]state.EndpointJSON `json:"stagedServices"`
	StaticConfig   any                                      `json:"staticConfig"`
	Version        versionJSON                              `json:"version"`
	Config         any                                      `json:"config"`
	Certificates   []certJSON                               `json:"certificates"`
	// WorkloadState is shared mode's pods (SPEC §8.2), absent otherwise.
	WorkloadState any `json:"workloadState,omitempty"`
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
	// WorkloadState, in shared mode, maps each pod's uid to its state and
	// connections; nil in the other modes.
	WorkloadState any
}

// ConfigDump renders in as /config_dump (SPEC §8.2).
func ConfigDump(in DumpInput) any {
	d := in.Snapshot.Dump()
	static := in.Static
	if static == nil {
		static = map[string]any{}
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
		WorkloadState: in.WorkloadState,
	}
}

// certificates renders the certificate states; private keys never appear
// (TESTPLAN 60).
func certificates(states []certs.State) []certJSON {
	out := make([]certJSON, 0, len(states))
	for _, s := range states {
		cj := certJSON{Identity: s.Identity.String(), State: s.Status, CertChain: []certItemJSON{}, RootCerts: []certItemJSON{}}
		if s.Cert != nil {
			for _, c := range s.Cert.Chain {
				cj.CertChain = append(cj.CertChain, certItem(c))
			}
			for _, c := range s.Cert.Roots {
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
