package envconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// MeshConfigPath is where ztunnel reads the mesh config (relative to its
// working directory, like its other default paths): a YAML MeshConfig whose
// defaultConfig is a ProxyConfig (SPEC §0.3).
const MeshConfigPath = "./etc/istio/config/mesh"

// ProxyConfig is the subset of Istio's ProxyConfig that ztunnel reads, from
// the mesh config's defaultConfig and then PROXY_CONFIG (YAML or JSON), the
// latter winning field by field. Other fields are ignored, as ztunnel
// ignores them. A nil pointer is a field neither source set.
type ProxyConfig struct {
	DiscoveryAddress *string           `yaml:"discoveryAddress" json:"discoveryAddress,omitempty"`
	ProxyAdminPort   *uint16           `yaml:"proxyAdminPort" json:"proxyAdminPort,omitempty"`
	StatsPort        *uint16           `yaml:"statsPort" json:"statsPort,omitempty"`
	Concurrency      *uint16           `yaml:"concurrency" json:"concurrency,omitempty"`
	ProxyMetadata    map[string]string `yaml:"proxyMetadata" json:"proxyMetadata,omitempty"`
}

// merge lays o over pc: o's set fields win, metadata maps are combined.
func (pc ProxyConfig) merge(o ProxyConfig) ProxyConfig {
	if o.DiscoveryAddress != nil {
		pc.DiscoveryAddress = o.DiscoveryAddress
	}
	if o.ProxyAdminPort != nil {
		pc.ProxyAdminPort = o.ProxyAdminPort
	}
	if o.StatsPort != nil {
		pc.StatsPort = o.StatsPort
	}
	if o.Concurrency != nil {
		pc.Concurrency = o.Concurrency
	}
	if len(o.ProxyMetadata) > 0 && pc.ProxyMetadata == nil {
		pc.ProxyMetadata = make(map[string]string, len(o.ProxyMetadata))
	}
	for k, v := range o.ProxyMetadata {
		pc.ProxyMetadata[k] = v
	}
	return pc
}

// loadProxyConfig reads the mesh config file at meshPath (absent, or ""
// for none, is fine) and PROXY_CONFIG (empty is fine), as ztunnel does; a
// file that cannot be read or either source that does not parse fails
// naming it.
func loadProxyConfig(l *loader, meshPath string) ProxyConfig {
	var pc ProxyConfig
	data, err := os.ReadFile(meshPath)
	switch {
	case meshPath == "", errors.Is(err, fs.ErrNotExist):
	case err != nil:
		l.fail("mesh config "+meshPath, "%v", err)
	default:
		var mc struct {
			DefaultConfig ProxyConfig `yaml:"defaultConfig"`
		}
		if err := yaml.Unmarshal(data, &mc); err != nil {
			l.fail("mesh config "+meshPath, "%s", oneLine(err))
		}
		pc = pc.merge(mc.DefaultConfig)
	}
	if v := l.get("PROXY_CONFIG"); v != "" {
		var env ProxyConfig
		// YAML is a superset of JSON, so this reads either form.
		if err := yaml.Unmarshal([]byte(v), &env); err != nil {
			l.fail("PROXY_CONFIG", "not a YAML or JSON ProxyConfig: %s", oneLine(err))
		}
		pc = pc.merge(env)
	}
	return pc
}

// metadata returns the proxy metadata: ProxyConfig.proxyMetadata with any
// ISTIO_META_ prefix stripped from its keys, then env (the ISTIO_META_*
// variables, already stripped) over it.
func (pc ProxyConfig) metadata(env map[string]string) map[string]string {
	m := make(map[string]string, len(pc.ProxyMetadata)+len(env))
	for k, v := range pc.ProxyMetadata {
		m[strings.TrimPrefix(k, "ISTIO_META_")] = v
	}
	for k, v := range env {
		m[k] = v
	}
	return m
}

// oneLine keeps a parser's error to one line for the start-up message.
func oneLine(err error) string {
	return strings.Join(strings.Fields(fmt.Sprint(err)), " ")
}
